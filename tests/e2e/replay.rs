//! Placeholder: tests for this concern are being written.
