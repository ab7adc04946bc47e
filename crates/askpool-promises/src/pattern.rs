//! Id patterns of `search`: `*` matches any run of characters (also none),
//! every other character only itself. SQLite's GLOB gives `?` and `[`
//! meanings of their own, so the SQLite store escapes them.

/// Whether `id` matches `pattern`.
pub fn matches(pattern: &str, id: &str) -> bool {
    let p = pattern.as_bytes();
    let s = id.as_bytes();
    // Greedy matcher with backtracking to the last star: linear in practice.
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

/// The SQLite GLOB pattern matching what [`matches`] matches.
pub(crate) fn to_glob(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 8);
    for c in pattern.chars() {
        match c {
            '?' => out.push_str("[?]"),
            '[' => out.push_str("[[]"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_match_runs_and_the_rest_matches_itself() {
        assert!(matches("*", ""));
        assert!(matches("*", "abc"));
        assert!(matches("a*", "abc"));
        assert!(matches("*c", "abc"));
        assert!(matches("a*c", "abbbc"));
        assert!(matches("a**c", "ac"));
        assert!(!matches("a*c", "abcd"));
        assert!(matches("a?[", "a?["));
        assert!(!matches("a?", "ab"));
        assert!(!matches("abc", "ab"));
        assert!(matches("*b*b", "abab"));
        assert!(!matches("*b*b", "abaa"));
    }

    #[test]
    fn glob_escapes_question_marks_and_brackets() {
        assert_eq!(to_glob("a?[*]"), "a[?][[]*]");
    }
}
