//! Vendor errors onto Berth's taxonomy. ComputeSDK rewrites many vendor errors into messages
//! ("E2B authentication failed…", "… quota exceeded…") and drops the HTTP status, so the
//! status is used when the sidecar saw one and the message otherwise.

use berth_contract::ErrorKind;

use crate::sidecar::VendorError;

/// The Berth error kind for an error a ComputeSDK call threw.
pub fn classify(error: &VendorError) -> ErrorKind {
    match error.code.as_deref() {
        Some("BERTH_NOT_FOUND") => return ErrorKind::NotFound,
        Some("BERTH_INVALID") => return ErrorKind::InvalidRequest,
        _ => {}
    }
    if let Some(status) = error.status {
        match status {
            401 | 403 => return ErrorKind::Auth,
            404 => return ErrorKind::NotFound,
            402 => return ErrorKind::Quota,
            409 => return ErrorKind::Conflict,
            429 => return ErrorKind::RateLimited,
            400 | 422 => return ErrorKind::InvalidRequest,
            503 => return ErrorKind::Capacity,
            500..=599 => return ErrorKind::Provider5xx,
            _ => {}
        }
    }
    if let Some(code) = error.code.as_deref() {
        if matches!(
            code,
            "ECONNREFUSED"
                | "ECONNRESET"
                | "ENOTFOUND"
                | "EAI_AGAIN"
                | "ETIMEDOUT"
                | "EHOSTUNREACH"
        ) || code.starts_with("UND_ERR")
        {
            return ErrorKind::Unavailable;
        }
    }
    let message = error.message.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| message.contains(n));
    if has(&[
        "authentication failed",
        "unauthorized",
        "unauthorised",
        "invalid api key",
        "api key format",
        "missing e2b api key",
        "forbidden",
        "401",
        "403",
    ]) {
        ErrorKind::Auth
    } else if has(&["rate limit", "too many requests", "429"]) {
        ErrorKind::RateLimited
    } else if has(&["quota", "limit exceeded", "insufficient credits", "billing"]) {
        ErrorKind::Quota
    } else if has(&["capacity", "no available", "out of resources"]) {
        ErrorKind::Capacity
    } else if server_status(&message) || has(&["internal server error", "internal error"]) {
        ErrorKind::Provider5xx
    } else if has(&[
        "temporarily unavailable",
        "service unavailable",
        "fetch failed",
        "econnrefused",
        "enotfound",
        "etimedout",
        "socket hang up",
        "network error",
    ]) {
        ErrorKind::Unavailable
    } else if has(&["not found", "404"]) {
        ErrorKind::NotFound
    } else {
        ErrorKind::Unknown
    }
}

/// A vendor SDK's "500: …" style message (the status survives only as text).
fn server_status(message: &str) -> bool {
    message
        .as_bytes()
        .windows(4)
        .any(|w| w[0] == b'5' && w[1].is_ascii_digit() && w[2].is_ascii_digit() && w[3] == b':')
}
