//! The walls a manifest declares, read from inside a sandbox; TTL (not yet exercised).

use super::*;

/// Linux capability numbers, by name (include/uapi/linux/capability.h).
pub(super) const CAPABILITY_BITS: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The walls the manifest declares are the walls a sandbox has, read from inside it: the
/// bounding capability set, `no_new_privs`, and the cgroup's pids and memory limits (v2 or v1).
pub(super) async fn default_walls(s: &Subject) -> Outcome {
    let Some(walls) = s.manifest.isolation.walls.clone() else {
        unreachable!("run_clause grades this clause not-applicable without declared walls")
    };
    on_sandbox(s, |id| async move {
        let out = sh(
            s,
            &id,
            "grep -E '^(NoNewPrivs|CapBnd):' /proc/self/status; \
             echo pids $(cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max); \
             echo memory $(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)",
        )
        .await?;
        let report = text(&out.stdout);
        let field = |name: &str| {
            report
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        let mut expected: u64 = 0;
        for name in &walls.capabilities {
            let bit = CAPABILITY_BITS
                .iter()
                .position(|c| c == name)
                .ok_or_else(|| format!("the manifest names an unknown capability `{name}`"))?;
            expected |= 1 << bit;
        }
        let bounding = u64::from_str_radix(&field("CapBnd:"), 16)
            .map_err(|_| format!("no CapBnd in /proc/self/status: {report:?}"))?;
        let extra: Vec<&str> = (0..CAPABILITY_BITS.len())
            .filter(|b| bounding & !expected & (1 << b) != 0)
            .map(|b| CAPABILITY_BITS[b])
            .collect();
        check!(extra.is_empty(), "capabilities beyond the declared set: {extra:?}");
        check!(
            bounding == expected,
            "bounding set {bounding:#x} lacks declared capabilities ({expected:#x})"
        );
        let nnp = field("NoNewPrivs:");
        check!(
            (nnp == "1") == walls.no_new_privileges,
            "NoNewPrivs is {nnp:?}; the manifest says {}",
            walls.no_new_privileges
        );
        let pids = field("pids ");
        check!(
            pids == walls.pids_limit.to_string(),
            "pids limit is {pids:?}; the manifest says {}",
            walls.pids_limit
        );
        let memory = field("memory ");
        check!(
            memory == (walls.memory_mib * 1024 * 1024).to_string(),
            "memory limit is {memory:?} bytes; the manifest says {} MiB",
            walls.memory_mib
        );
        Ok(vec![format!(
            "capabilities {:?}, no_new_privs {nnp}, pids {pids}, memory {memory}",
            walls.capabilities
        )])
    })
    .await
}

/// No local provider has provider-enforced TTL, so these clauses have never run against a real
/// implementation; until they have, a provider declaring TTL gets `unverified`, never `pass`.
pub(super) async fn ttl_unexercised(_s: &Subject) -> Outcome {
    Outcome::Unverified(
        "TTL clauses (teardown fires when due; never during an active exec) are not implemented \
         in this suite yet"
            .into(),
    )
}
