//! The attack suite (issue 18): each attack a party could try on the real stack (real
//! nats-server, storage, scheduler, gateway and EP), tried and refused with a clear error, and
//! nothing lost. SECURITY.md names the test behind each refusal. One module per party.
mod annexes;
mod dlq;
mod failures;
mod files;
mod guests;
mod kafka;
mod nats;
mod renewals;
mod scheduler;
mod servers;
mod tenancy;
mod traces;
mod webhooks;
