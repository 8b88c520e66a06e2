//! Prometheus metrics of each component, scraped from a running stack.
