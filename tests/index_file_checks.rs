//! A corrupt or foreign index file is detected on open with a clear error, and nothing is read
//! out of bounds; arbitrary bytes and arbitrary damage never panic the reader.

mod common;

use datahelix::index::{read_all_bytes, Index, IndexError, INDEX_PATH};
use proptest::prelude::*;

fn indexed_copy() -> (tempfile::TempDir, Vec<u8>) {
    let tmp = common::copy_dataset(&common::tiny_dataset());
    let o = common::run(common::datahelix().arg("index").arg(tmp.path()));
    assert!(o.status.success());
    let bytes = std::fs::read(tmp.path().join(INDEX_PATH)).unwrap();
    (tmp, bytes)
}

fn open_with(bytes: &[u8]) -> Result<Index, IndexError> {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("index");
    std::fs::write(&path, bytes).unwrap();
    Index::open_file(&path)
}

#[test]
fn a_good_index_reads_back() {
    let (_tmp, bytes) = indexed_copy();
    let all = read_all_bytes(&bytes).unwrap();
    assert_eq!(all.len(), 12);
    assert!(all.iter().all(|(d, p)| d.status.is_ok() && !p.is_empty()));
}

#[test]
fn foreign_truncated_and_other_version_files_are_named() {
    let (_tmp, bytes) = indexed_copy();
    assert!(matches!(open_with(b"PK\x03\x04 a zip file"), Err(IndexError::NotAnIndex)));
    assert!(matches!(open_with(b""), Err(IndexError::NotAnIndex)));
    assert!(matches!(open_with(&bytes[..bytes.len() - 1]), Err(IndexError::Truncated { .. })));
    assert!(matches!(open_with(&bytes[..64]), Err(IndexError::Truncated { .. })));
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(open_with(&longer), Err(IndexError::Corrupt(_))));
    let mut v2 = bytes.clone();
    v2[8] = 2;
    let err = open_with(&v2).unwrap_err();
    assert!(matches!(err, IndexError::Version { found: 2, supported: 1 }));
    assert!(err.to_string().contains("datahelix index"), "the error says what to do: {err}");
    let mut count = bytes.clone();
    count[16] ^= 0x40; // a count the file cannot hold (the header checksum also catches it)
    assert!(matches!(open_with(&count), Err(IndexError::Corrupt(_))));
}

#[test]
fn a_changed_manifest_makes_the_index_stale() {
    let (tmp, _) = indexed_copy();
    assert!(Index::open(tmp.path()).is_ok());
    let manifest = tmp.path().join("manifest.jsonl");
    // Rewriting the same bytes (a new mtime) is not a change.
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, &text).unwrap();
    assert!(Index::open(tmp.path()).is_ok());
    std::fs::write(&manifest, text.replacen("\"text_tokens\":", "\"text_tokens\": ", 1)).unwrap();
    let err = Index::open(tmp.path()).unwrap_err();
    assert!(matches!(err, IndexError::Stale { .. }), "{err}");
    assert!(err.to_string().contains("datahelix index"));
}

#[test]
fn damaged_records_are_errors_not_panics() {
    let (_tmp, bytes) = indexed_copy();
    // Status byte of record 3 set to a value no writer uses.
    let mut bad = bytes.clone();
    bad[128 + 3 * 96 + 91] = 200;
    let index = open_with(&bad).unwrap();
    assert!(index.get(2).is_ok());
    let err = index.get(3).unwrap_err();
    assert!(err.to_string().contains("record 3"), "{err}");
    // A path reference pointing past the path table.
    let mut bad = bytes.clone();
    bad[128 + 5 * 96 + 40..128 + 5 * 96 + 48].copy_from_slice(&u64::MAX.to_le_bytes());
    let index = open_with(&bad).unwrap();
    assert!(index.path(5).is_err());
    assert!(matches!(index.get(12), Err(IndexError::OutOfRange { index: 12, len: 12 })));
}

fn good_index_bytes() -> Vec<u8> {
    use std::sync::OnceLock;
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| std::fs::read(common::tiny_dataset().join(INDEX_PATH)).unwrap()).clone()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = read_all_bytes(&bytes);
    }

    #[test]
    fn arbitrary_bytes_behind_a_valid_magic_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let mut bytes = b"DHXINDEX".to_vec();
        bytes.extend(tail);
        let _ = read_all_bytes(&bytes);
    }

    #[test]
    fn damaged_real_indexes_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let mut bytes = good_index_bytes();
        for (at, v) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= v;
        }
        if do_cut {
            let n = cut.index(bytes.len());
            bytes.truncate(n);
        }
        if let Ok(records) = read_all_bytes(&bytes) {
            // Whatever survives the checks is in bounds and decodable.
            prop_assert!(records.len() <= 12);
        }
    }

    #[test]
    fn manifest_parser_accounts_for_every_line(text in "(\\PC{0,40}\n){0,20}") {
        let m = datahelix::manifest::parse(text.as_bytes());
        let non_blank = text.split('\n').filter(|l| !l.bytes().all(|b| b.is_ascii_whitespace())).count();
        prop_assert_eq!(m.entries.len() + m.errors.len(), non_blank);
    }

    #[test]
    fn manifest_parser_survives_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = datahelix::manifest::parse(&bytes);
    }
}
