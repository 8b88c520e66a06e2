//! htfaas example function: checksums of the input file.
//!
//! Reads `/input/<name>` (its path is the first argument) in 64 KiB chunks, computes adler32
//! (as dCache records it) and sha256, and writes `/output/<name>.checksums.json`:
//! `{"file":"<name>","size":N,"adler32":"<8 hex>","sha256":"<64 hex>"}`.
//!
//! With `HTFAAS_STAMP=1` in its environment (as `htfaas bench` registers it) it first prints
//! `start_unix_ns=<the wall clock in ns>` on stderr, so the bench can time an event to the
//! moment its function starts.

use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::process::ExitCode;

/// Adler-32 (RFC 1950), computed incrementally.
struct Adler32 {
    a: u32,
    b: u32,
}

impl Adler32 {
    const MOD: u32 = 65_521;
    /// Largest run of bytes before the sums must be reduced so they cannot overflow u32.
    const NMAX: usize = 5552;

    fn new() -> Self {
        Adler32 { a: 1, b: 0 }
    }

    fn update(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(Self::NMAX) {
            for &byte in chunk {
                self.a += u32::from(byte);
                self.b += self.a;
            }
            self.a %= Self::MOD;
            self.b %= Self::MOD;
        }
    }

    fn finish(&self) -> u32 {
        (self.b << 16) | self.a
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn run() -> Result<(), String> {
    let input = std::env::args().nth(1).ok_or("usage: checksum /input/<file>")?;
    let name = input.rsplit('/').next().filter(|n| !n.is_empty()).ok_or("input path has no file name")?;
    let mut file = std::fs::File::open(&input).map_err(|e| format!("open {input}: {e}"))?;
    let mut adler = Adler32::new();
    let mut sha = Sha256::new();
    let mut size: u64 = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).map_err(|e| format!("read {input}: {e}"))?;
        if n == 0 {
            break;
        }
        adler.update(&buf[..n]);
        sha.update(&buf[..n]);
        size += n as u64;
    }
    let json = format!(
        "{{\"file\":\"{}\",\"size\":{size},\"adler32\":\"{:08x}\",\"sha256\":\"{}\"}}\n",
        name.replace('\\', "\\\\").replace('"', "\\\""),
        adler.finish(),
        hex(&sha.finalize())
    );
    let out = format!("/output/{name}.checksums.json");
    let mut f = std::fs::File::create(&out).map_err(|e| format!("create {out}: {e}"))?;
    f.write_all(json.as_bytes()).map_err(|e| format!("write {out}: {e}"))?;
    println!("checksum: {name}: {size} bytes");
    Ok(())
}

fn main() -> ExitCode {
    if std::env::var_os("HTFAAS_STAMP").is_some() {
        let ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        eprintln!("start_unix_ns={ns}");
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("checksum: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adler32_known_value() {
        let mut a = Adler32::new();
        a.update(b"Wikipedia");
        assert_eq!(a.finish(), 0x11E6_0398);
    }
}
