//! The one place host I/O errors become classified provider errors.

use std::io;

use berth_contract::{ErrorKind, ProviderError};

use crate::PROVIDER_ID;

/// Classifies an I/O error from operation `what`.
pub(crate) fn io_error(what: &str, err: io::Error) -> ProviderError {
    let kind = match err.kind() {
        io::ErrorKind::NotFound => ErrorKind::NotFound,
        io::ErrorKind::AlreadyExists => ErrorKind::Conflict,
        io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidInput => ErrorKind::InvalidRequest,
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => ErrorKind::Capacity,
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => ErrorKind::Unavailable,
        _ => ErrorKind::Unknown,
    };
    ProviderError::new(kind, PROVIDER_ID, format!("cannot {what}")).with_source(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_kinds_are_classified() {
        let cases = [
            (io::ErrorKind::NotFound, ErrorKind::NotFound),
            (io::ErrorKind::AlreadyExists, ErrorKind::Conflict),
            (io::ErrorKind::PermissionDenied, ErrorKind::InvalidRequest),
            (io::ErrorKind::StorageFull, ErrorKind::Capacity),
            (io::ErrorKind::BrokenPipe, ErrorKind::Unknown),
        ];
        for (io_kind, expected) in cases {
            let err = io_error("do it", io::Error::from(io_kind));
            assert_eq!(err.kind(), expected, "{io_kind:?}");
            assert!(err.to_string().contains("cannot do it"));
        }
    }
}
