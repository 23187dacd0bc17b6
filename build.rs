/// Tells the tests whether the data the repository may not ship is at hand:
/// with `PREP_EXTERNAL_DATA` set at build time, `cfg(prep_external_data)`
/// is on and the tests that read it run; without, they are compiled as
/// ignored, with their reason, so the test framework reports them skipped
/// rather than passing having checked nothing. prep-chat's build script is
/// this file too (`include!`), so the rule is written once.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(prep_external_data)");
    println!("cargo::rerun-if-env-changed=PREP_EXTERNAL_DATA");
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var_os("PREP_EXTERNAL_DATA").is_some_and(|v| !v.is_empty()) {
        println!("cargo::rustc-cfg=prep_external_data");
    }
}
