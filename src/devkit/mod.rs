//! A function developer's kit, with no stack: `htfaas fn new` makes a ready project from the
//! templates embedded in the binary ([`new_project`]), and `htfaas fn build` turns a project
//! into the wasm an EP runs ([`fn@build`]): Rust for `wasm32-wasip1` with cargo, C with clang and
//! wasi-libc, Python with componentize-py and JavaScript with componentize-js (both into WASI
//! preview 2 components, against the WASI WIT vendored in `wit/` and embedded here). A project
//! says its language in `htfaas.toml` ([`Project::detect`]; without one, by its files). A
//! native function's image is built by mmdebstrap ([`build_image`]).
//!
//! Knows the toolchains' command lines and the templates; must not know: the stack, the
//! gateway's API, the EP's runtime (`htfaas fn run` is `htfaas_ep::local`), commands.

mod build;
mod image;
mod templates;

pub use build::{Built, Tools, build};
pub use image::{BuiltImage, ImageSpec, build_image, digest_of_file, parse_add};
pub use templates::{new_native_project, new_project};

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The project file `fn new` writes and `fn build` reads.
pub const PROJECT_FILE: &str = "htfaas.toml";

/// A language `fn new` and `fn build` know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// Rust, built for `wasm32-wasip1` (a WASI preview 1 module).
    Rust,
    /// C, built with clang for `wasm32-wasi` against wasi-libc (a preview 1 module).
    C,
    /// Python, built by componentize-py into a WASI preview 2 component.
    Python,
    /// JavaScript, built by componentize-js (StarlingMonkey) into a preview 2 component.
    Js,
}

impl Lang {
    /// Every language, in the order help texts list them.
    pub const ALL: [Lang; 4] = [Lang::Rust, Lang::C, Lang::Python, Lang::Js];

    /// The name used in `htfaas.toml` and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::C => "c",
            Lang::Python => "python",
            Lang::Js => "js",
        }
    }
}

impl fmt::Display for Lang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Lang {
    type Err = DevError;
    fn from_str(s: &str) -> Result<Lang, DevError> {
        match s.to_ascii_lowercase().as_str() {
            "rust" | "rs" => Ok(Lang::Rust),
            "c" => Ok(Lang::C),
            "python" | "py" => Ok(Lang::Python),
            "js" | "javascript" => Ok(Lang::Js),
            _ => Err(DevError::UnknownLang(s.to_owned())),
        }
    }
}

/// Why `fn new` or `fn build` could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// A file could not be read, written or made.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Not one of [`Lang::ALL`].
    #[error("unknown language {0:?}: rust, c, python or js")]
    UnknownLang(String),
    /// A function name `fn new` refuses.
    #[error("function name {0:?}: 1-64 characters of a-z, 0-9, '-' and '_', starting with a letter")]
    BadName(String),
    /// `fn new` would overwrite something.
    #[error("{0} already exists and is not empty; choose another --dir")]
    Exists(PathBuf),
    /// No `htfaas.toml` and no file that tells the language.
    #[error(
        "{0}: no htfaas.toml, and no Cargo.toml, *.c, app.py or app.js to tell the language by (htfaas fn new makes a project)"
    )]
    NoProject(PathBuf),
    /// `htfaas.toml` does not parse.
    #[error("{path}: line {line}: {why}")]
    BadProjectFile {
        /// The file.
        path: PathBuf,
        /// Its line, from 1.
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// A toolchain the language needs is not installed.
    #[error("{tool} not found: {hint}")]
    ToolMissing {
        /// The program.
        tool: String,
        /// How to install it.
        hint: String,
    },
    /// The toolchain ran and failed.
    #[error("{tool} failed ({status}):\n{output}")]
    BuildFailed {
        /// The program.
        tool: String,
        /// Its exit status.
        status: String,
        /// The end of its stderr and stdout.
        output: String,
    },
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DevError {
    let what = what.into();
    move |source| DevError::Io { what, source }
}

/// Whether `name` is a function name `fn new` takes (also a crate, file and Python module name
/// once `-` is read as `_`).
pub fn check_name(name: &str) -> Result<(), DevError> {
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok { Ok(()) } else { Err(DevError::BadName(name.to_owned())) }
}

/// A function project on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project {
    /// Its directory.
    pub dir: PathBuf,
    /// The function's name (the wasm file's stem).
    pub name: String,
    /// Its language.
    pub lang: Lang,
    /// Python and JavaScript: the entry module (`app`: `app.py`, `app.js`); C: the source file.
    pub entry: Option<String>,
}

impl Project {
    /// The project in `dir`: from its `htfaas.toml` (`name`, `lang`, optional `entry`), else
    /// guessed from its files (`Cargo.toml`: Rust; `app.py`: Python; `app.js`: JavaScript; one
    /// `*.c`: C), named after the directory.
    pub fn detect(dir: &Path) -> Result<Project, DevError> {
        let file = dir.join(PROJECT_FILE);
        match std::fs::read_to_string(&file) {
            Ok(text) => return Project::parse(dir, &file, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(format!("read {}", file.display()))(e)),
        }
        let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
        let name = abs.file_name().and_then(|n| n.to_str()).unwrap_or("function").to_owned();
        let has = |f: &str| dir.join(f).is_file();
        let lang = if has("Cargo.toml") {
            Lang::Rust
        } else if has("app.py") {
            Lang::Python
        } else if has("app.js") {
            Lang::Js
        } else if c_sources(dir)?.len() == 1 {
            Lang::C
        } else {
            return Err(DevError::NoProject(dir.to_owned()));
        };
        Ok(Project { dir: dir.to_owned(), name, lang, entry: None })
    }

    /// `key = "value"` lines; `#` starts a comment; other keys are refused.
    fn parse(dir: &Path, file: &Path, text: &str) -> Result<Project, DevError> {
        let (mut name, mut lang, mut entry) = (None, None, None);
        for (i, raw) in text.lines().enumerate() {
            let bad = |why: String| DevError::BadProjectFile { path: file.to_owned(), line: i + 1, why };
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(bad("expected key = \"value\"".into()));
            };
            let value = value.trim();
            let Some(value) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else {
                return Err(bad(format!("the value of {} must be a \"quoted string\"", key.trim())));
            };
            match key.trim() {
                "name" => name = Some(value.to_owned()),
                "lang" => lang = Some(value.parse::<Lang>().map_err(|e| bad(e.to_string()))?),
                "entry" => entry = Some(value.to_owned()),
                other => return Err(bad(format!("unknown key {other:?} (name, lang, entry)"))),
            }
        }
        let missing = |key: &str| DevError::BadProjectFile { path: file.to_owned(), line: 0, why: format!("no {key}") };
        let name = name.ok_or_else(|| missing("name"))?;
        check_name(&name)?;
        Ok(Project { dir: dir.to_owned(), name, lang: lang.ok_or_else(|| missing("lang"))?, entry })
    }
}

/// The `*.c` files at the top of `dir`, sorted.
pub(crate) fn c_sources(dir: &Path) -> Result<Vec<PathBuf>, DevError> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(format!("list {}", dir.display())))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "c") && p.is_file())
        .collect();
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_files_parse_and_refuse_what_they_do_not_know() {
        let dir = Path::new("/p");
        let file = dir.join(PROJECT_FILE);
        let p =
            Project::parse(dir, &file, "# c\nname = \"stats\"\nlang = \"python\" # the language\n").expect("parses");
        assert_eq!((p.name.as_str(), p.lang, p.entry), ("stats", Lang::Python, None));
        for (text, why) in [
            ("name = stats\nlang = \"c\"", "quoted"),
            ("name = \"s\"\nlang = \"cobol\"", "unknown language"),
            ("name = \"s\"\nlang = \"c\"\nversion = \"1\"", "unknown key"),
            ("lang = \"c\"", "no name"),
            ("name \"s\"", "expected key"),
        ] {
            let e = Project::parse(dir, &file, text).expect_err(text).to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
        assert!(matches!(Project::parse(dir, &file, "name = \"Bad Name\"\nlang = \"c\""), Err(DevError::BadName(_))));
    }

    #[test]
    fn names_are_plain() {
        for ok in ["stats", "csv-stats", "a1_b"] {
            check_name(ok).expect(ok);
        }
        for bad in ["", "1a", "Stats", "a b", "../x", &"a".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
