//! API scopes: developer and admin tokens, each refused where it should be; the OpenAPI document.
