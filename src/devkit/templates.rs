//! The project templates of `htfaas fn new`, embedded in the binary: per language its source
//! (the guest contract in its first comment), `htfaas.toml`, a sample input, a README and a
//! `.gitignore`; `__NAME__` in them becomes the function's name.
//!
//! Must not know: how a project is built (`build`), the stack.

use super::{DevError, Lang, PROJECT_FILE, check_name, io};
use std::path::{Path, PathBuf};

const README: &str = include_str!("templates/README.md");
const SAMPLE: &str = include_str!("templates/sample.txt");

/// The files of a `lang` project: (path in the project, contents before substitution).
fn files(lang: Lang) -> Vec<(&'static str, &'static str)> {
    match lang {
        Lang::Rust => vec![
            ("Cargo.toml", include_str!("templates/rust/Cargo.toml")),
            ("src/main.rs", include_str!("templates/rust/src/main.rs")),
            (".gitignore", "/target\n*.wasm\nout/\n"),
        ],
        Lang::C => vec![("main.c", include_str!("templates/c/main.c")), (".gitignore", "*.wasm\nout/\n")],
        Lang::Python => {
            vec![("app.py", include_str!("templates/python/app.py")), (".gitignore", "*.wasm\nout/\n__pycache__/\n")]
        }
        Lang::Js => vec![("app.js", include_str!("templates/js/app.js")), (".gitignore", "*.wasm\nout/\n")],
    }
}

/// What the README says of each language: its title, its source file, its toolchain.
fn about(lang: Lang) -> (&'static str, &'static str, &'static str) {
    match lang {
        Lang::Rust => (
            "Rust",
            "src/main.rs",
            "`htfaas fn build` runs `cargo build --release --target wasm32-wasip1` (add the target with \
             `rustup target add wasm32-wasip1`). Any crate that builds for that target can be used.",
        ),
        Lang::C => (
            "C",
            "main.c",
            "`htfaas fn build` runs `clang --target=wasm32-wasi -O2` against wasi-libc (Debian: `apt-get install \
             clang lld wasi-libc libclang-rt-14-dev-wasm32`; `CC` picks another clang, `WASI_SYSROOT` another \
             sysroot).",
        ),
        Lang::Python => (
            "Python",
            "app.py",
            "`htfaas fn build` runs componentize-py 0.25.1 (`pip install componentize-py==0.25.1`; found on `PATH` \
             or at `HTFAAS_COMPONENTIZE_PY`) against the WASI WIT built into htfaas, making a WASI preview 2 \
             component of about 19 MB (CPython 3.14 and the standard library). Pure-Python packages are \
             found on the module path (`-p` of componentize-py: this directory and the active virtualenv's \
             site-packages); packages with native code, numpy among them, cannot be used: PyPI has no WASI \
             build of them. The first run on an EP compiles the component (5-13 s); EPs compile a registered \
             function ahead of its first event and keep it on disk.",
        ),
        Lang::Js => (
            "JavaScript",
            "app.js",
            "`htfaas fn build` runs componentize-js 0.23.0 (`npm install @bytecodealliance/componentize-js@0.23.0`; \
             found on `PATH`, in `./node_modules/.bin` or at `HTFAAS_COMPONENTIZE_JS`) against the WASI WIT built \
             into htfaas, making a WASI preview 2 component of about 14 MB (the StarlingMonkey engine). There is \
             no `fs` module: files are read and written through the `wasi:filesystem` imports, as `app.js` does.",
        ),
    }
}

/// Writes a new native function project for `name` into `dir` (created; it must not exist or
/// be empty): Python with numpy (`app/main.py`, which also serves as a handler with the loop of
/// `app/htfaas_handler.py`), its image recipe (`build-image.sh`), a README
/// and a float32 sample. Returns the files written.
pub fn new_native_project(name: &str, dir: &Path) -> Result<Vec<PathBuf>, DevError> {
    check_name(name)?;
    if let Ok(mut entries) = std::fs::read_dir(dir)
        && entries.next().is_some()
    {
        return Err(DevError::Exists(dir.to_owned()));
    }
    let sample: Vec<u8> = (0..1024u32).flat_map(|i| ((i % 32) as f32 * 0.5).to_le_bytes()).collect();
    let texts = [
        ("app/main.py", include_str!("templates/native-python/main.py")),
        ("app/htfaas_handler.py", include_str!("templates/native-python/htfaas_handler.py")),
        ("build-image.sh", include_str!("templates/native-python/build-image.sh")),
        ("README.md", include_str!("templates/native-python/README.md")),
        (".gitignore", "*.tar\nout/\n__pycache__/\n"),
    ];
    let mut written = Vec::new();
    for (rel, text) in texts {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(format!("create {}", parent.display())))?;
        }
        std::fs::write(&path, text.replace("__NAME__", name)).map_err(io(format!("write {}", path.display())))?;
        written.push(path);
    }
    {
        use std::os::unix::fs::PermissionsExt as _;
        let script = dir.join("build-image.sh");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .map_err(io(format!("chmod {}", script.display())))?;
    }
    let path = dir.join("sample.f32");
    std::fs::write(&path, sample).map_err(io(format!("write {}", path.display())))?;
    written.push(path);
    Ok(written)
}

/// Writes a new `lang` project for function `name` into `dir` (created; it must not exist or
/// be empty). Returns the files written.
pub fn new_project(name: &str, lang: Lang, dir: &Path) -> Result<Vec<PathBuf>, DevError> {
    check_name(name)?;
    if let Ok(mut entries) = std::fs::read_dir(dir)
        && entries.next().is_some()
    {
        return Err(DevError::Exists(dir.to_owned()));
    }
    let (title, source, toolchain) = about(lang);
    let entry = match lang {
        Lang::Python | Lang::Js => "entry = \"app\"\n",
        Lang::C => "entry = \"main.c\"\n",
        Lang::Rust => "",
    };
    let project = format!(
        "# An htfaas function project (htfaas fn new); `htfaas fn build` reads it.\nname = \"{name}\"\nlang = \"{lang}\"\n{entry}"
    );
    let readme = README.replace("__LANG__", title).replace("__SOURCE__", source).replace("__TOOLCHAIN__", toolchain);
    let mut all: Vec<(&str, String)> = files(lang).into_iter().map(|(p, text)| (p, text.to_owned())).collect();
    all.push((PROJECT_FILE, project));
    all.push(("README.md", readme));
    all.push(("sample.txt", SAMPLE.to_owned()));
    let mut written = Vec::new();
    for (rel, text) in all {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(format!("create {}", parent.display())))?;
        }
        std::fs::write(&path, text.replace("__NAME__", name)).map_err(io(format!("write {}", path.display())))?;
        written.push(path);
    }
    Ok(written)
}
