//! The web console: static pages served by the gateway, reading the HTTP API with the caller's token.
