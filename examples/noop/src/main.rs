//! htfaas example function that does nothing: what the path around a function costs.
//!
//! With `HTFAAS_STAMP=1` in its environment (as `htfaas bench` registers it) it prints
//! `start_unix_ns=<the wall clock in ns>` on stderr as its first action, so the bench can time
//! an event to the moment its function starts.

fn main() {
    if std::env::var_os("HTFAAS_STAMP").is_some() {
        let ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        eprintln!("start_unix_ns={ns}");
    }
}
