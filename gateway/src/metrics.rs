//! Prometheus metrics of the gateway.
