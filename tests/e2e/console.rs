//! The web console, driven in headless Chromium over the DevTools protocol.
