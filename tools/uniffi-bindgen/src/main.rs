//! `uniffi-bindgen generate --library <lib> --language kotlin|swift|python --out-dir <dir>`
fn main() {
    uniffi::uniffi_bindgen_main()
}
