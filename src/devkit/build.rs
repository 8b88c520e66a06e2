//! `htfaas fn build`: one toolchain run per language, into `<project>/<name>.wasm` (or `-o`).
//!
//! - Rust: `cargo build --release --target wasm32-wasip1` with the project's own target
//!   directory (whatever `CARGO_TARGET_DIR` says), then the binary copied out;
//! - C: `clang --target=wasm32-wasi -O2 -std=c11 … -lm -Wl,--strip-all` (as `examples/c`);
//! - Python: `componentize-py -d <wit> -w function componentize <entry> -p .` in the project, the
//!   vendored WASI WIT written to a temporary directory first;
//! - JavaScript: `componentize-js --wit <wit> -n function -d http -d fetch-event <entry>.js`
//!   (the EP links no `wasi:http`).
//!
//! A missing toolchain is [`DevError::ToolMissing`] with how to install it; a failed build is
//! [`DevError::BuildFailed`] with the end of the tool's output.
//!
//! Must not know: the stack, the EP, commands.

use super::{DevError, Lang, Project, c_sources, io};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The vendored WASI WIT (`wit/`), written out for componentize-py and componentize-js.
const WIT: [(&str, &str); 7] = [
    ("world.wit", include_str!("../../wit/world.wit")),
    ("deps/cli.wit", include_str!("../../wit/deps/cli.wit")),
    ("deps/clocks.wit", include_str!("../../wit/deps/clocks.wit")),
    ("deps/filesystem.wit", include_str!("../../wit/deps/filesystem.wit")),
    ("deps/io.wit", include_str!("../../wit/deps/io.wit")),
    ("deps/random.wit", include_str!("../../wit/deps/random.wit")),
    ("deps/sockets.wit", include_str!("../../wit/deps/sockets.wit")),
];
/// The world in `wit/world.wit`.
const WORLD: &str = "function";
/// Most bytes of a failed tool's output kept in the error.
const OUTPUT_TAIL: usize = 4000;

/// Where each toolchain is; [`Tools::from_env`] finds them the usual way.
#[derive(Debug, Clone)]
pub struct Tools {
    /// `cargo`.
    pub cargo: PathBuf,
    /// The C compiler (clang).
    pub cc: PathBuf,
    /// The wasi-libc sysroot, when not clang's default.
    pub wasi_sysroot: Option<PathBuf>,
    /// `componentize-py`, when found.
    pub componentize_py: Option<PathBuf>,
    /// `componentize-js`, when found.
    pub componentize_js: Option<PathBuf>,
}

impl Tools {
    /// `CARGO` or `cargo`; `CC` or `clang`; `WASI_SYSROOT`; `HTFAAS_COMPONENTIZE_PY` or
    /// `componentize-py` on `PATH`; `HTFAAS_COMPONENTIZE_JS`, `componentize-js` on `PATH` or in
    /// `<project>/node_modules/.bin`.
    pub fn from_env(project: &Path) -> Tools {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let local_js = project.join("node_modules/.bin/componentize-js");
        Tools {
            cargo: var("CARGO").unwrap_or_else(|| "cargo".into()),
            cc: var("CC").unwrap_or_else(|| "clang".into()),
            wasi_sysroot: var("WASI_SYSROOT"),
            componentize_py: var("HTFAAS_COMPONENTIZE_PY").or_else(|| on_path("componentize-py")),
            componentize_js: var("HTFAAS_COMPONENTIZE_JS")
                .or_else(|| on_path("componentize-js"))
                .or_else(|| local_js.is_file().then_some(local_js)),
        }
    }
}

/// `name`'s path on `PATH`, if it is there.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(name)).find(|p| p.is_file())
}

/// What a build made.
#[derive(Debug, Clone)]
pub struct Built {
    /// The wasm file.
    pub path: PathBuf,
    /// Its size, bytes.
    pub bytes: u64,
    /// How long the toolchain ran.
    pub took: Duration,
}

/// Builds `project` into `out` (default `<project>/<name>.wasm`).
pub fn build(project: &Project, out: Option<&Path>, tools: &Tools) -> Result<Built, DevError> {
    let out = match out {
        Some(o) => o.to_owned(),
        None => project.dir.join(format!("{}.wasm", project.name)),
    };
    let out = std::path::absolute(&out).map_err(io(format!("resolve {}", out.display())))?;
    let started = Instant::now();
    match project.lang {
        Lang::Rust => rust(project, &out, tools)?,
        Lang::C => c(project, &out, tools)?,
        Lang::Python => python(project, &out, tools)?,
        Lang::Js => js(project, &out, tools)?,
    }
    let bytes = std::fs::metadata(&out).map_err(io(format!("stat {}", out.display())))?.len();
    Ok(Built { path: out, bytes, took: started.elapsed() })
}

/// Runs `cmd` (named `tool`), mapping "not found" to [`DevError::ToolMissing`] with `hint`.
fn run(tool: &str, mut cmd: Command, hint: &str) -> Result<(), DevError> {
    let output = match cmd.output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(DevError::ToolMissing { tool: tool.to_owned(), hint: hint.to_owned() });
        }
        Err(e) => return Err(io(format!("run {tool}"))(e)),
    };
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stdout));
    let text = text.trim();
    let mut cut = text.len().saturating_sub(OUTPUT_TAIL);
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    Err(DevError::BuildFailed { tool: tool.to_owned(), status: output.status.to_string(), output: text[cut..].into() })
}

fn rust(project: &Project, out: &Path, tools: &Tools) -> Result<(), DevError> {
    let target_dir = project.dir.join("target");
    let mut cmd = Command::new(&tools.cargo);
    cmd.args(["build", "--release", "--target", "wasm32-wasip1", "--manifest-path"])
        .arg(project.dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
    run("cargo", cmd, "install Rust (rustup) and `rustup target add wasm32-wasip1`")?;
    let built = target_dir.join(format!("wasm32-wasip1/release/{}.wasm", project.name));
    std::fs::copy(&built, out).map_err(io(format!("copy {} to {}", built.display(), out.display())))?;
    Ok(())
}

fn c(project: &Project, out: &Path, tools: &Tools) -> Result<(), DevError> {
    let source = match &project.entry {
        Some(e) => project.dir.join(e),
        None => match c_sources(&project.dir)?.as_slice() {
            [one] => one.clone(),
            _ => return Err(DevError::NoProject(project.dir.clone())),
        },
    };
    let mut cmd = Command::new(&tools.cc);
    cmd.args(["--target=wasm32-wasi", "-O2", "-std=c11", "-Wall", "-Wextra"]);
    if let Some(sysroot) = &tools.wasi_sysroot {
        cmd.arg(format!("--sysroot={}", sysroot.display()));
    }
    cmd.arg("-o").arg(out).arg(&source).args(["-lm", "-Wl,--strip-all"]);
    run(
        &tools.cc.display().to_string(),
        cmd,
        "install clang and wasi-libc (Debian: apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32), or set CC",
    )
}

/// The vendored WIT written to a fresh temporary directory (removed when dropped).
fn wit_dir() -> Result<tempfile::TempDir, DevError> {
    let dir = tempfile::tempdir().map_err(io("create a temporary directory for the WIT"))?;
    for (rel, text) in WIT {
        let path = dir.path().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(format!("create {}", parent.display())))?;
        }
        std::fs::write(&path, text).map_err(io(format!("write {}", path.display())))?;
    }
    Ok(dir)
}

fn python(project: &Project, out: &Path, tools: &Tools) -> Result<(), DevError> {
    let hint = "pip install componentize-py==0.25.1 (scripts/install-deps.sh puts it in .tools/venv), \
                or set HTFAAS_COMPONENTIZE_PY";
    let Some(tool) = &tools.componentize_py else {
        return Err(DevError::ToolMissing { tool: "componentize-py".into(), hint: hint.into() });
    };
    let wit = wit_dir()?;
    let entry = project.entry.as_deref().unwrap_or("app");
    let mut cmd = Command::new(tool);
    cmd.current_dir(&project.dir)
        .arg("-q")
        .arg("-d")
        .arg(wit.path())
        // Run in the project's directory: `-p .` is the project (its modules, pure-Python packages).
        .args(["-w", WORLD, "componentize", entry, "-p", "."])
        .arg("-o")
        .arg(out);
    run("componentize-py", cmd, hint)
}

fn js(project: &Project, out: &Path, tools: &Tools) -> Result<(), DevError> {
    let hint = "npm install @bytecodealliance/componentize-js@0.23.0 (node 20+), or set HTFAAS_COMPONENTIZE_JS";
    let Some(tool) = &tools.componentize_js else {
        return Err(DevError::ToolMissing { tool: "componentize-js".into(), hint: hint.into() });
    };
    let wit = wit_dir()?;
    let entry = project.entry.as_deref().unwrap_or("app");
    let mut cmd = Command::new(tool);
    cmd.current_dir(&project.dir)
        .arg("--wit")
        .arg(wit.path())
        .args(["-n", WORLD, "-d", "http", "-d", "fetch-event", "-o"])
        .arg(out)
        .arg(format!("{entry}.js"));
    run("componentize-js", cmd, hint)
}
