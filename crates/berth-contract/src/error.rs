//! The error taxonomy. Each adapter classifies its failures into an [`ErrorKind`] in one place;
//! callers act on the kind (retry, fall back, fix the request), never on message text.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Capability;

/// A boxed underlying cause, kept in the error's `source` chain.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias for provider calls.
pub type Result<T, E = ProviderError> = std::result::Result<T, E>;

/// What kind of failure happened, as far as a caller needs to know to act.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// Credentials missing, wrong or expired. Not retryable: fix the credential.
    Auth,
    /// An account quota is exhausted. Not retryable on this provider; fallback may move on.
    Quota,
    /// The provider throttled the call. Retryable after a back-off.
    RateLimited,
    /// The provider has no capacity right now. Retryable; fallback may move on.
    Capacity,
    /// The provider (or its daemon/socket) cannot be reached. Retryable; fallback may move on.
    Unavailable,
    /// The request is malformed or forbidden (bad path, bad image name). Not retryable.
    InvalidRequest,
    /// The sandbox or object does not exist. Not retryable.
    NotFound,
    /// A conflicting state change is in progress or the name is taken. Retryable after the
    /// other change settles.
    Conflict,
    /// The capability is not supported by this provider. Not retryable; never a fallback reason.
    Unsupported,
    /// Berth's own deadline passed before the provider answered. Retryable; the operation may
    /// still have happened.
    TimeoutClient,
    /// The provider reported its own timeout. Retryable.
    TimeoutServer,
    /// The provider failed internally (HTTP 5xx or equivalent). Retryable.
    #[serde(rename = "provider_5xx")]
    Provider5xx,
    /// The sandbox interfered with Berth's control channel: its supervisor's socket is served
    /// by another process (replaced or impersonated from inside). Nothing was sent. Not
    /// retryable: the sandbox is compromised; destroy it.
    Tampered,
    /// Berth or the host lacks a piece this provider needs (a program, a daemon's API version,
    /// a directory, a binary Berth should carry). Not retryable until it is installed — the
    /// message names the fix; fallback may move on (another provider may be set up).
    Setup,
    /// Not classified. Not retryable, because nothing says it is safe.
    Unknown,
}

impl ErrorKind {
    /// Every kind, for documentation and tests.
    pub const ALL: [ErrorKind; 15] = [
        ErrorKind::Auth,
        ErrorKind::Quota,
        ErrorKind::RateLimited,
        ErrorKind::Capacity,
        ErrorKind::Unavailable,
        ErrorKind::InvalidRequest,
        ErrorKind::NotFound,
        ErrorKind::Conflict,
        ErrorKind::Unsupported,
        ErrorKind::TimeoutClient,
        ErrorKind::TimeoutServer,
        ErrorKind::Provider5xx,
        ErrorKind::Tampered,
        ErrorKind::Setup,
        ErrorKind::Unknown,
    ];

    /// Whether repeating the same call later may succeed.
    pub fn retryable(self) -> bool {
        match self {
            ErrorKind::RateLimited
            | ErrorKind::Capacity
            | ErrorKind::Unavailable
            | ErrorKind::Conflict
            | ErrorKind::TimeoutClient
            | ErrorKind::TimeoutServer
            | ErrorKind::Provider5xx => true,
            ErrorKind::Auth
            | ErrorKind::Quota
            | ErrorKind::InvalidRequest
            | ErrorKind::NotFound
            | ErrorKind::Unsupported
            | ErrorKind::Tampered
            | ErrorKind::Setup
            | ErrorKind::Unknown => false,
        }
    }

    /// Whether an ordered fallback may move on to the next provider. Only capacity, quota, a
    /// rate limit and unavailability (or a provider this host is not set up for) qualify — the
    /// provider cannot take the work now, another may; `Unsupported` never does (a missing
    /// capability is a request error, not a reason to silently change provider).
    pub fn allows_fallback(self) -> bool {
        matches!(
            self,
            ErrorKind::Capacity
                | ErrorKind::Quota
                | ErrorKind::RateLimited
                | ErrorKind::Unavailable
                | ErrorKind::Setup
        )
    }

    /// The snake_case name used in JSON and ledgers.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Auth => "auth",
            ErrorKind::Quota => "quota",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Capacity => "capacity",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::TimeoutClient => "timeout_client",
            ErrorKind::TimeoutServer => "timeout_server",
            ErrorKind::Provider5xx => "provider_5xx",
            ErrorKind::Tampered => "tampered",
            ErrorKind::Setup => "setup",
            ErrorKind::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed provider call.
///
/// Messages are lowercase fragments that never contain secret values.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// The capability is not supported by this provider.
    #[error("provider `{provider}` does not support `{capability}`")]
    Unsupported {
        /// The capability that was asked for.
        capability: Capability,
        /// The provider id.
        provider: String,
    },
    /// The command could not be started in the sandbox (never a made-up exit code; the CLI
    /// reports 127/126 like `docker exec`).
    #[error("provider `{provider}`: {message}")]
    NotStarted {
        /// Why.
        failure: StartFailure,
        /// The provider id.
        provider: String,
        /// What failed, naming the command.
        message: String,
    },
    /// Any other classified failure.
    #[error("provider `{provider}`: {message}")]
    Failed {
        /// The classification.
        kind: ErrorKind,
        /// The provider id.
        provider: String,
        /// What failed, as a lowercase fragment.
        message: String,
        /// The underlying cause.
        #[source]
        source: Option<BoxError>,
    },
}

/// Why a command did not start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFailure {
    /// No such program in the sandbox.
    NotFound,
    /// The program exists but cannot be executed (permissions, not an executable).
    NotExecutable,
    /// Anything else (a working directory that does not exist, resource limits, …).
    Other,
}

impl StartFailure {
    /// From the supervisor's and reaper's wire names (`not_found`, `permission_denied`, …).
    pub fn from_wire(kind: &str) -> StartFailure {
        match kind {
            "not_found" => StartFailure::NotFound,
            "permission_denied" => StartFailure::NotExecutable,
            _ => StartFailure::Other,
        }
    }
}

impl ProviderError {
    /// The command could not be started.
    pub fn not_started(
        failure: StartFailure,
        provider: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ProviderError::NotStarted {
            failure,
            provider: provider.into(),
            message: message.into(),
        }
    }

    /// A classified failure without an underlying cause.
    pub fn new(kind: ErrorKind, provider: impl Into<String>, message: impl Into<String>) -> Self {
        ProviderError::Failed {
            kind,
            provider: provider.into(),
            message: message.into(),
            source: None,
        }
    }

    /// The capability is not supported by `provider`.
    pub fn unsupported(capability: Capability, provider: impl Into<String>) -> Self {
        ProviderError::Unsupported {
            capability,
            provider: provider.into(),
        }
    }

    /// Attaches an underlying cause.
    pub fn with_source(self, cause: impl Into<BoxError>) -> Self {
        match self {
            ProviderError::Failed {
                kind,
                provider,
                message,
                ..
            } => ProviderError::Failed {
                kind,
                provider,
                message,
                source: Some(cause.into()),
            },
            other => other,
        }
    }

    /// The same error attributed to `provider` (for adapters built on shared machinery).
    pub fn with_provider(self, provider: impl Into<String>) -> Self {
        match self {
            ProviderError::Unsupported { capability, .. } => ProviderError::Unsupported {
                capability,
                provider: provider.into(),
            },
            ProviderError::NotStarted {
                failure, message, ..
            } => ProviderError::NotStarted {
                failure,
                provider: provider.into(),
                message,
            },
            ProviderError::Failed {
                kind,
                message,
                source,
                ..
            } => ProviderError::Failed {
                kind,
                provider: provider.into(),
                message,
                source,
            },
        }
    }

    /// What failed, without the provider's name: for a message that wraps this error and is
    /// itself attributed to a provider.
    pub fn message(&self) -> std::borrow::Cow<'_, str> {
        match self {
            ProviderError::Unsupported { capability, .. } => {
                format!("`{capability}` is not supported").into()
            }
            ProviderError::NotStarted { message, .. } | ProviderError::Failed { message, .. } => {
                message.as_str().into()
            }
        }
    }

    /// The classification a caller acts on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ProviderError::Unsupported { .. } => ErrorKind::Unsupported,
            ProviderError::NotStarted { failure, .. } => match failure {
                StartFailure::NotFound => ErrorKind::NotFound,
                StartFailure::NotExecutable => ErrorKind::InvalidRequest,
                StartFailure::Other => ErrorKind::Unknown,
            },
            ProviderError::Failed { kind, .. } => *kind,
        }
    }

    /// Shorthand for `self.kind().retryable()`.
    pub fn retryable(&self) -> bool {
        self.kind().retryable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_carries_no_provider_name() {
        let failed = ProviderError::new(ErrorKind::NotFound, "local", "gone");
        assert_eq!(failed.message(), "gone");
        assert_eq!(failed.to_string(), "provider `local`: gone");
        let not_started = ProviderError::not_started(StartFailure::NotFound, "local", "no `x`");
        assert_eq!(not_started.message(), "no `x`");
        let unsupported = ProviderError::unsupported(Capability::Fork, "local");
        assert!(!unsupported.message().contains("local"));
    }

    #[test]
    fn fallback_only_on_capacity_quota_rate_limit_unavailable_setup() {
        let fallback: Vec<_> = ErrorKind::ALL
            .into_iter()
            .filter(|k| k.allows_fallback())
            .collect();
        assert_eq!(
            fallback,
            vec![
                ErrorKind::Quota,
                ErrorKind::RateLimited,
                ErrorKind::Capacity,
                ErrorKind::Unavailable,
                ErrorKind::Setup
            ]
        );
        assert!(!ErrorKind::Unsupported.allows_fallback());
    }

    #[test]
    fn retryable_classification_is_documented_per_kind() {
        let retryable: Vec<_> = ErrorKind::ALL
            .into_iter()
            .filter(|k| k.retryable())
            .map(ErrorKind::as_str)
            .collect();
        assert_eq!(
            retryable,
            vec![
                "rate_limited",
                "capacity",
                "unavailable",
                "conflict",
                "timeout_client",
                "timeout_server",
                "provider_5xx"
            ]
        );
    }

    #[test]
    fn unsupported_names_capability_and_provider() {
        let err = ProviderError::unsupported(Capability::SuspendResume, "host");
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        assert_eq!(
            err.to_string(),
            "provider `host` does not support `suspend_resume`"
        );
    }

    #[test]
    fn source_is_kept_in_the_chain() {
        let io = std::io::Error::other("disk on fire");
        let err =
            ProviderError::new(ErrorKind::Unavailable, "host", "cannot write").with_source(io);
        let source = std::error::Error::source(&err).expect("source kept");
        assert_eq!(source.to_string(), "disk on fire");
        assert!(err.retryable());
    }

    #[test]
    fn kind_names_serialize_as_documented() {
        for kind in ErrorKind::ALL {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
        }
    }
}
