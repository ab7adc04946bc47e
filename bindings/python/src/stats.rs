//! Node and pool statistics as plain dicts (the wrapper types them).

use askpool::{NodeStats, PoolStats};
use pyo3::prelude::*;
use pyo3::types::PyDict;

pub(crate) fn pool_dict<'py>(py: Python<'py>, s: &PoolStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &s.name)?;
    d.set_item("in_flight", s.in_flight)?;
    d.set_item("queued", s.queued)?;
    d.set_item("admitted", s.admitted)?;
    d.set_item("handler_runs", s.handler_runs)?;
    d.set_item("duplicate_acks", s.duplicate_acks)?;
    d.set_item("replays", s.replays)?;
    d.set_item("suppressed_replies", s.suppressed_replies)?;
    d.set_item("rejected_full", s.rejected_full)?;
    d.set_item("cancels", s.cancels)?;
    d.set_item("expired", s.expired)?;
    d.set_item("dedup_in_progress", s.dedup.in_progress)?;
    d.set_item("dedup_terminal", s.dedup.terminal)?;
    Ok(d)
}

pub(crate) fn node_dict<'py>(py: Python<'py>, s: &NodeStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("pending", s.pending)?;
    d.set_item("armed_timers", s.armed_timers)?;
    d.set_item("retries", s.retries)?;
    d.set_item("late_outcomes", s.late_outcomes)?;
    d.set_item("timed_out_records", s.timed_out_records)?;
    d.set_item("dlq_depth", s.dlq_depth)?;
    d.set_item("dlq_dropped", s.dlq_dropped)?;
    let pools = PyDict::new(py);
    for p in &s.pools {
        pools.set_item(&p.name, pool_dict(py, p)?)?;
    }
    d.set_item("pools", pools)?;
    Ok(d)
}
