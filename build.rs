/// Tells the tests whether the data the repository may not ship is at hand:
/// with `PREP_EXTERNAL_DATA` set at build time, `cfg(prep_external_data)`
/// is on and the tests that read it run; without, they are compiled as
/// ignored, with their reason, so the test framework reports them skipped
/// rather than passing having checked nothing. prep-chat's build script is
/// this file too (`include!`), so the rule is written once.
///
/// With `PREP_BY_HAND` set, `cfg(prep_by_hand)` builds the tests that are
/// not part of `make test` at all (the engines over the whole corpus, a
/// 17 GiB round trip): `make test-by-hand` runs them, in release.
///
/// Where the build runs with CAP_SYS_ADMIN (root, as CI runs),
/// `cfg(prep_can_mount)` builds the tests that mount a small tmpfs to fill
/// as they run; elsewhere they are compiled as ignored, with their reason.
/// Built with it, a test that then cannot mount fails.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(prep_external_data)");
    println!("cargo::rustc-check-cfg=cfg(prep_by_hand)");
    println!("cargo::rustc-check-cfg=cfg(prep_can_mount)");
    println!("cargo::rerun-if-env-changed=PREP_EXTERNAL_DATA");
    println!("cargo::rerun-if-env-changed=PREP_BY_HAND");
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var_os("PREP_EXTERNAL_DATA").is_some_and(|v| !v.is_empty()) {
        println!("cargo::rustc-cfg=prep_external_data");
    }
    if std::env::var_os("PREP_BY_HAND").is_some_and(|v| !v.is_empty()) {
        println!("cargo::rustc-cfg=prep_by_hand");
    }
    if can_mount() {
        println!("cargo::rustc-cfg=prep_can_mount");
    }
}

/// Whether this process holds CAP_SYS_ADMIN (bit 21 of `CapEff` in
/// /proc/self/status), which mounting takes; `false` off Linux.
fn can_mount() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|caps| u64::from_str_radix(caps.trim(), 16).ok())
        .is_some_and(|caps| (caps >> CAP_SYS_ADMIN) & 1 == 1)
}
