//! The gateway's audit trail: events received, rules matched, tokens minted, macaroons obtained, admin actions.
