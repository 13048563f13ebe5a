//! Links `berth` with packed relative relocations (DT_RELR) when the C library it will run
//! against can load them.
//!
//! `berth` is a position-independent executable with ~44,000 relative relocations: their table
//! is about 1 MB that the loader reads at every start. Packed, it is about 11 kB, and
//! `berth --version` went 2.4 → 2.0 ms on a machine of the CI kind (every `berth exec` pays the same
//! start). The loader must understand DT_RELR (glibc 2.36 and later), and the linker marks the
//! binary as needing it, so the flag is given only for a native build on such a glibc — a
//! binary built here runs here. (A non-PIE link saved another 0.6 ms but gives up address
//! randomisation of the binary: not worth it for a tool that reads hostile bytes.)

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    if target != host || !target.ends_with("-linux-gnu") {
        return;
    }
    if glibc_version().is_some_and(|version| version >= (2, 36)) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// The build machine's glibc version, from `getconf GNU_LIBC_VERSION` (`glibc 2.36`).
fn glibc_version() -> Option<(u32, u32)> {
    let out = Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.trim().strip_prefix("glibc ")?;
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}
