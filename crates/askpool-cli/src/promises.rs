//! `askpool promises`: inspect and settle the durable promises in a SQLite
//! store file.

use std::path::PathBuf;
use std::process::ExitCode;

use askpool_promises::{
    now_millis, CompleteRequest, Completion, Promise, PromiseError, SearchQuery, SqliteStore,
    State, Store,
};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

#[derive(Subcommand)]
pub enum PromisesCommand {
    /// List promises, by id.
    List(ListArgs),
    /// Show one promise.
    Get(IdArgs),
    /// Resolve a pending promise.
    Resolve(CompleteArgs),
    /// Reject a pending promise.
    Reject(CompleteArgs),
    /// Cancel a pending promise.
    Cancel(CompleteArgs),
}

#[derive(Args)]
pub struct Common {
    /// The SQLite store file.
    #[arg(long)]
    db: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ListArgs {
    #[command(flatten)]
    common: Common,
    /// Id pattern; `*` matches any run of characters.
    #[arg(long, default_value = "*")]
    pattern: String,
    /// Only promises in this state (pending, resolved, rejected, canceled,
    /// timedout).
    #[arg(long)]
    state: Option<State>,
    /// Most promises to list.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// List the promises after this id (paging).
    #[arg(long)]
    after: Option<String>,
}

#[derive(Args)]
pub struct IdArgs {
    /// The promise id.
    id: String,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
pub struct CompleteArgs {
    /// The promise id.
    id: String,
    #[command(flatten)]
    common: Common,
    /// The value, as text.
    #[arg(long, default_value = "")]
    value: String,
    /// Idempotency key: completing again with the same key replays.
    #[arg(long)]
    key: Option<String>,
}

pub fn run(command: PromisesCommand) -> ExitCode {
    let (common, outcome) = match command {
        PromisesCommand::List(a) => {
            let mut q = SearchQuery::new(a.pattern).limit(a.limit);
            q.state = a.state;
            q.after = a.after;
            let out = open(&a.common).and_then(|s| s.search(&q, now_millis()));
            let limit = a.limit;
            (
                a.common,
                out.map(|ps| {
                    // A full page may not be all: say where the next starts.
                    let more_after = (ps.len() >= limit)
                        .then(|| ps.last().map(|p| p.id.clone()))
                        .flatten();
                    Shown::Many(ps, more_after)
                }),
            )
        }
        PromisesCommand::Get(a) => {
            let out = open(&a.common).and_then(|s| s.get(&a.id, now_millis()));
            (a.common, out.map(Shown::One))
        }
        PromisesCommand::Resolve(a) => complete(a, Completion::Resolve),
        PromisesCommand::Reject(a) => complete(a, Completion::Reject),
        PromisesCommand::Cancel(a) => complete(a, Completion::Cancel),
    };
    match outcome {
        // Nothing was written and the promise is not in the state asked
        // for (it timed out first, or this key settled it another way):
        // a script must not read that as done.
        Ok(Shown::Completed(p, completion, _)) if p.state != completion.state() => {
            let message = format!(
                "promise {} is already {}: not {}",
                printable(&p.id),
                p.state,
                completion.state()
            );
            if common.json {
                println!(
                    "{}",
                    json!({ "error": { "code": "AlreadySettled", "message": message } })
                );
            }
            eprintln!("askpool promises: {message}");
            ExitCode::FAILURE
        }
        Ok(shown) => {
            if common.json {
                println!("{}", shown.json());
            } else {
                print!("{}", shown.table());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            if common.json {
                println!(
                    "{}",
                    json!({ "error": { "code": e.code(), "message": e.to_string() } })
                );
            }
            eprintln!("askpool promises: {e}");
            ExitCode::FAILURE
        }
    }
}

fn complete(a: CompleteArgs, completion: Completion) -> (Common, Result<Shown, PromiseError>) {
    let mut req = CompleteRequest::new(a.id, completion).value(a.value.into_bytes());
    req.key = a.key;
    let out = open(&a.common).and_then(|s| s.complete(&req, now_millis()));
    (
        a.common,
        out.map(|c| Shown::Completed(c.promise, completion, c.replayed)),
    )
}

/// Opens an existing store of this build's schema: inspection never
/// creates a file, makes an empty one a store, or migrates a store that
/// older services still use.
fn open(common: &Common) -> Result<SqliteStore, PromiseError> {
    SqliteStore::open_existing(&common.db)
}

enum Shown {
    One(Promise),
    /// A page of a list, and the id to list after for the next page if the
    /// page is full.
    Many(Vec<Promise>, Option<String>),
    /// What a completion left, and whether it was replayed: settled before
    /// (by a completion with the same idempotency key, or timed out), so
    /// nothing was written and the promise is shown as stored, which may
    /// differ from this command's value.
    Completed(Promise, Completion, bool),
}

impl Shown {
    fn json(&self) -> Value {
        match self {
            Shown::One(p) => promise_json(p),
            Shown::Many(ps, _) => Value::Array(ps.iter().map(promise_json).collect()),
            Shown::Completed(p, _, replayed) => {
                let mut json = promise_json(p);
                json["replayed"] = Value::Bool(*replayed);
                json
            }
        }
    }

    fn table(&self) -> String {
        let rows: &[Promise] = match self {
            Shown::One(p) | Shown::Completed(p, _, _) => std::slice::from_ref(p),
            Shown::Many(ps, _) => ps,
        };
        let header = [
            "ID", "STATE", "CREATED", "SETTLED", "TIMEOUT", "PARAM", "VALUE",
        ];
        let mut cells: Vec<[String; 7]> = vec![header.map(String::from)];
        for p in rows {
            cells.push([
                printable(&p.id),
                p.state.to_string(),
                utc(p.created_at),
                p.settled_at.map(utc).unwrap_or_else(|| "-".into()),
                utc(p.timeout_at),
                short(&payload(&p.param).0),
                p.value
                    .as_deref()
                    .map_or("-".into(), |v| short(&payload(v).0)),
            ]);
        }
        let widths: Vec<usize> = (0..7)
            .map(|c| {
                cells
                    .iter()
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &cells {
            let line: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
        }
        out.push_str(&format!(
            "({} promise{})\n",
            rows.len(),
            if rows.len() == 1 { "" } else { "s" }
        ));
        match self {
            // An escaped id is not the id `--after` must be given.
            Shown::Many(_, Some(last)) if printable(last) == *last => out.push_str(&format!(
                "(a full page: the next one starts with --after {last})\n"
            )),
            Shown::Many(_, Some(_)) => out.push_str(
                "(a full page: the next one starts with --after the last id, as --json shows it)\n",
            ),
            Shown::Completed(_, _, true) => out.push_str(
                "(replayed: a completion with this key settled it before; nothing was written)\n",
            ),
            _ => {}
        }
        out
    }
}

/// `s` with its control characters and backslashes escaped (`\n`,
/// `\u{1b}`, `\\`): an id may hold any but NUL, and one must not split a
/// row or drive the terminal, nor read as another id.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() || c == '\\' {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A payload as text if it is printable UTF-8, else as `0x` hex.
fn payload(bytes: &[u8]) -> (String, &'static str) {
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.chars().any(char::is_control) => (s.to_owned(), "utf8"),
        _ => {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            (format!("0x{hex}"), "hex")
        }
    }
}

fn short(s: &str) -> String {
    if s.chars().count() <= 32 {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(31).collect::<String>())
    }
}

fn promise_json(p: &Promise) -> Value {
    let (param, param_encoding) = payload(&p.param);
    let value = p.value.as_deref().map(payload);
    json!({
        "id": p.id,
        "state": p.state.as_str(),
        "param": param,
        "param_encoding": param_encoding,
        "value": value.as_ref().map(|v| v.0.clone()),
        "value_encoding": value.as_ref().map(|v| v.1),
        "timeout_at": p.timeout_at,
        "create_key": p.create_key,
        "complete_key": p.complete_key,
        "strict": p.strict,
        "tags": p.tags,
        "created_at": p.created_at,
        "settled_at": p.settled_at,
    })
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS` UTC.
fn utc(ms: u64) -> String {
    if ms >= askpool_promises::MAX_TIME {
        return "never".into();
    }
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_795_000_000_123), "2026-11-18 11:06:40");
        assert_eq!(utc(u64::MAX), "never");
    }

    #[test]
    fn payloads_show_as_text_or_hex() {
        assert_eq!(payload(b"hi"), ("hi".into(), "utf8"));
        assert_eq!(payload(&[0, 255]), ("0x00ff".into(), "hex"));
    }
}
