//! Entry point of the dashboard: mounts [`client::App`] on `<body>`. `wasm-bindgen` runs `main` when
//! the page calls the generated module's `init()`.

fn main() {
    console_error_panic_hook::set_once();
    leptos::mount::mount_to_body(client::App);
}
