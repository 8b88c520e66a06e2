//! Lineage across the gateway and scheduler trails: a written file leads back to its event, rule, digest, tokens and input.
