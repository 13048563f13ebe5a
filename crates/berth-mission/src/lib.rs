//! Missions: coding-agent work as durable mission → task → attempt records.
//!
//! - [`mod@file`] — the mission file (TOML, schema-versioned, JSON Schema published): repository and
//!   base commit, provider and fallbacks, image, harness, ordered tasks with validators.
//! - [`authority`] — the pure, synchronous state machine that alone decides task transitions:
//!   deterministic attempt keys, retry until `max_attempts`, exhaustion terminal, and a task
//!   advances only when its accepted attempt has a commit, a restorable checkpoint and a completed
//!   finalization.
//!
//! This crate does no I/O. The service over the store and the tick orchestrator (which performs
//! side effects and reports them as events) build on it.

pub mod authority;
pub mod file;
