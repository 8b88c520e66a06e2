//! Prometheus metrics of the scheduler.
