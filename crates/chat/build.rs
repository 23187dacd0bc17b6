// The workspace's build script: `cfg(prep_external_data)` for the tests
// that read what the repository does not ship.
include!("../../build.rs");
