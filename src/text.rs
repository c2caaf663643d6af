//! Quoting untrusted text in messages.
//!
//! ```
//! assert_eq!(datahelix::text::clipped("abc", 8), "abc");
//! assert_eq!(datahelix::text::clipped(&"x".repeat(100), 4), "xxxx… (100 bytes)");
//! ```

/// `s` cut to its first `max_chars` characters, saying how long it was: a value from a file, a
/// peer or a caller quoted in an error must not make the message a megabyte.
pub fn clipped(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        None => s.to_string(),
        Some((cut, _)) => format!("{}… ({} bytes)", &s[..cut], s.len()),
    }
}
