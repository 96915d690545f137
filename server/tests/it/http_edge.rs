//! The HTTP edge: where the dashboard comes from.

use server::http::{Dashboard, ServeConfig};

use testkit::*;

// ---- the dashboard ----

/// With no `--static-dir`, the dashboard embedded in the binary is served (or none), never a
/// directory found at a path known when the binary was built.
#[test]
fn without_a_static_dir_the_embedded_dashboard_is_chosen() {
    let mut config = test_config(vec![]);
    config.server.static_dir = None;
    let serve = ServeConfig::new(config).unwrap();
    assert!(
        matches!(serve.dashboard, Dashboard::Embedded | Dashboard::Missing),
        "{:?}",
        serve.dashboard
    );
}
