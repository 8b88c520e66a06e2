//! `htfaas trace`'s tree: each job's spans indented under its gateway span, with their lengths
//! and, for the hops, their span ids (what the components' log lines carry as `trace_id` and
//! the `traceparent` they passed on). Must not know: where the spans come from.

use htfaas::client::TraceView;

/// Prints `view` as a tree, or as JSON.
pub fn trace(view: &TraceView, json: bool) -> anyhow::Result<()> {
    if json {
        return super::json(view);
    }
    println!("trace {}", view.trace_id);
    if let Some((id, path)) = &view.event {
        println!("event {id}  {path}");
    }
    for s in &view.spans {
        let indent = "   ".repeat(s.depth);
        let took = match s.ms() {
            Some(ms) => format!("{ms} ms"),
            None if s.end_ms.is_none() && s.start_ms.is_some() => "running".into(),
            None => "?".into(),
        };
        let id = s.span_id.as_deref().map(|id| format!("  [{id}]")).unwrap_or_default();
        let detail = if s.detail.is_empty() { String::new() } else { format!("  {}", s.detail) };
        println!("{indent}└─ {:<16} {took:>9}{detail}{id}", s.name);
    }
    Ok(())
}
