//! htfaas sandbox probe: tries every escape the EP must refuse, and one write it must allow.
//!
//! Prints one JSON line per attempt to stdout, `{"attempt":"…","ok":bool,"error":"…"}`, then
//! exits 0. `ok` says whether the operation succeeded; the EP's tests assert that only
//! `create /output/ok.txt` did. The input's guest path is the first argument.

use std::io::{Read, Write};

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn report(attempt: &str, result: Result<String, String>) {
    let (ok, error) = match result {
        Ok(detail) => (true, detail),
        Err(e) => (false, e),
    };
    println!("{{\"attempt\":{},\"ok\":{ok},\"error\":{}}}", json_str(attempt), json_str(&error));
}

fn read(path: &str) -> Result<String, String> {
    let mut s = String::new();
    std::fs::File::open(path).and_then(|mut f| f.read_to_string(&mut s)).map_err(|e| e.to_string())?;
    Ok(format!("read {} bytes", s.len()))
}

fn create(path: &str) -> Result<String, String> {
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(b"sandbox-probe was here\n"))
        .map(|()| "created".to_owned())
        .map_err(|e| e.to_string())
}

fn main() {
    let input = std::env::args().nth(1).unwrap_or_else(|| "/input/missing".to_owned());

    report("read /etc/passwd", read("/etc/passwd"));
    report("read /input/../../etc/hostname", read("/input/../../etc/hostname"));
    report("read ../etc/passwd", read("../etc/passwd"));
    report(
        &format!("open {input} for writing"),
        std::fs::OpenOptions::new()
            .write(true)
            .open(&input)
            .and_then(|mut f| f.write_all(b"overwritten"))
            .map(|()| "written".to_owned())
            .map_err(|e| e.to_string()),
    );
    report("create /input/new", create("/input/new"));
    report("create /tmp/x", create("/tmp/x"));
    report("create /output/../escape", create("/output/../escape"));
    report("list /", std::fs::read_dir("/").map(|d| format!("{} entries", d.count())).map_err(|e| e.to_string()));
    for var in ["HOME", "PATH"] {
        report(&format!("env {var}"), std::env::var(var).map(|v| format!("{var}={v}")).map_err(|e| e.to_string()));
    }
    let all: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
    report(
        "list env",
        if all.is_empty() { Err("no variables".to_owned()) } else { Ok(format!("variables: {}", all.join(","))) },
    );
    report(
        "tcp connect 127.0.0.1:80",
        std::net::TcpStream::connect("127.0.0.1:80").map(|_| "connected".to_owned()).map_err(|e| e.to_string()),
    );
    report(
        "tcp bind 127.0.0.1:0",
        std::net::TcpListener::bind("127.0.0.1:0").map(|_| "bound".to_owned()).map_err(|e| e.to_string()),
    );
    // `env:NAME` arguments: NAME's value as the guest sees it, into /output/env-NAME.txt (what
    // a function's env and secrets reach).
    for name in std::env::args().skip(2).filter_map(|a| a.strip_prefix("env:").map(str::to_owned)) {
        let value = std::env::var(&name).unwrap_or_else(|_| "<unset>".to_owned());
        report(
            &format!("write env {name}"),
            std::fs::write(format!("/output/env-{name}.txt"), value)
                .map(|()| "written".to_owned())
                .map_err(|e| e.to_string()),
        );
    }
    // Last, so the escapes above cannot have been helped by it.
    report("create /output/ok.txt", create("/output/ok.txt"));
}
