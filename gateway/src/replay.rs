//! Replay and dry-run over recorded events. (Being written.)
