//! __NAME__: an htfaas function in Rust (built with `htfaas fn build` for wasm32-wasip1, run with
//! `htfaas fn run`).
//!
//! The guest contract (the same for every language):
//! - argv[1] is the input file, `/input/<name>` (read-only); later arguments are the manifest's
//!   args (`htfaas fn register --arg …`);
//! - every top-level regular file left in `/output` is stored in the function's output directory
//!   under the same name; subdirectories and symbolic links are not stored;
//! - the environment holds exactly the manifest's env; there is no network, no other file;
//! - exit status 0 is success; anything else fails the job, and stdout/stderr are kept in the
//!   job's log (`htfaas jobs log ID`).

use std::io::Read;
use std::process::ExitCode;

fn count(path: &str) -> std::io::Result<(u64, u64, u64)> {
    let mut file = std::fs::File::open(path)?;
    let (mut bytes, mut lines, mut words, mut in_word) = (0u64, 0u64, 0u64, false);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        for &b in &buf[..n] {
            lines += u64::from(b == b'\n');
            let space = b.is_ascii_whitespace();
            words += u64::from(!space && !in_word);
            in_word = !space;
        }
        bytes += n as u64;
    }
    Ok((bytes, lines, words))
}

fn main() -> ExitCode {
    let Some(input) = std::env::args().nth(1) else {
        eprintln!("usage: __NAME__ /input/<file>");
        return ExitCode::from(2);
    };
    let name = input.rsplit('/').next().unwrap_or("input").to_owned();
    let (bytes, lines, words) = match count(&input) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("__NAME__: {input}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = format!(r#"{{"file":"{name}","bytes":{bytes},"lines":{lines},"words":{words}}}"#);
    if let Err(e) = std::fs::write(format!("/output/{name}.count.json"), json) {
        eprintln!("__NAME__: write the output: {e}");
        return ExitCode::FAILURE;
    }
    println!("__NAME__: {lines} lines");
    ExitCode::SUCCESS
}
