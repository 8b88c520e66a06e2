//! Prometheus metrics of the EP.
