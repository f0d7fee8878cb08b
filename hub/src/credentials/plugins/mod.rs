//! Bundled credential plugins (`kleym credential …`).
