//! The one glob dialect of trigger paths: absolute, `*` within a path segment, `**` across
//! segments, `\` escapes.
//!
//! Must not know: trigger rules, manifests, events.

/// Why a glob was refused; the message names the glob.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GlobError {
    /// The glob does not start with `/`.
    #[error("{0:?} must be absolute (start with '/')")]
    NotAbsolute(String),
    /// The glob does not parse (shown in the message, not returned as the source).
    #[error("{glob:?}: {error}")]
    Syntax {
        /// The glob given.
        glob: String,
        /// What globset said.
        error: globset::Error,
    },
}

/// Compiles a trigger glob: absolute, `*` within a segment, `**` across segments.
pub fn compile_glob(glob: &str) -> Result<globset::GlobMatcher, GlobError> {
    if !glob.starts_with('/') {
        return Err(GlobError::NotAbsolute(glob.to_owned()));
    }
    globset::GlobBuilder::new(glob)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|error| GlobError::Syntax { glob: glob.to_owned(), error })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_star_stays_in_a_segment_and_double_star_spans() {
        let g = compile_glob("/data/raw/**").expect("valid glob");
        assert!(g.is_match("/data/raw/a.dat"));
        assert!(g.is_match("/data/raw/x/y/z.dat"));
        assert!(!g.is_match("/data/rawx/a.dat"));
        assert!(!g.is_match("/data/checksums/a.dat"));
        let one = compile_glob("/data/*.h5").expect("valid glob");
        assert!(one.is_match("/data/a.h5"));
        assert!(!one.is_match("/data/x/a.h5"));
        assert!(compile_glob("data/**").is_err());
    }
}
