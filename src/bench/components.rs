//! Part 4 of `htfaas bench`: the figures of the components' own benches (scheduler dispatch,
//! EP instantiate, compute and data path, gateway ingest), gathered into [`super::Figure`]s.
