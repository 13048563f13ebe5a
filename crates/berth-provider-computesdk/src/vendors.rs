//! The ComputeSDK providers this build bridges, and what Berth knows about each.

/// What Berth knows about one ComputeSDK provider package (read from its source at the pinned
/// version; see the decision record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vendor {
    /// ComputeSDK's provider name (`just-bash`, `e2b`, …).
    pub name: &'static str,
    /// Its sandboxes live inside the sidecar process (they end with it).
    pub in_process: bool,
    /// `getById` returns null only for "not found" (it throws on other failures), so a null is
    /// proof of absence.
    pub absence_is_authoritative: bool,
    /// A sandbox `getById` finds is ready for exec (ComputeSDK reports no state of its own).
    pub found_means_running: bool,
    /// It boots sandboxes from an image or template (a request's `image` goes to it).
    pub images: bool,
    /// It can give a sandbox outbound network (`bridge`). Every bridged vendor can run one
    /// without network (Berth's default), through its own create option (see `sidecar.mjs`).
    pub network_bridge: bool,
}

/// The ComputeSDK providers this build bridges.
pub const VENDORS: [Vendor; 4] = [
    // A Map lookup in the sidecar; an interpreter with networking off by default.
    Vendor {
        name: "just-bash",
        in_process: true,
        absence_is_authoritative: true,
        found_means_running: true,
        images: false,
        network_bridge: false,
    },
    // `Sandbox.connect` inside a catch-all: any failure (auth, network) is null.
    Vendor {
        name: "e2b",
        in_process: false,
        absence_is_authoritative: false,
        found_means_running: false,
        images: true,
        network_bridge: true,
    },
    // Null only when the error says "not found" or 404; anything else throws.
    Vendor {
        name: "daytona",
        in_process: false,
        absence_is_authoritative: true,
        found_means_running: false,
        images: true,
        network_bridge: true,
    },
    // `sandboxes.fromId` inside a catch-all.
    Vendor {
        name: "modal",
        in_process: false,
        absence_is_authoritative: false,
        found_means_running: false,
        images: true,
        network_bridge: true,
    },
];

/// The vendor a Berth provider id names (`computesdk:e2b` → e2b).
pub fn vendor(provider_id: &str) -> Option<Vendor> {
    let name = provider_id.strip_prefix("computesdk:")?;
    VENDORS.into_iter().find(|v| v.name == name)
}
