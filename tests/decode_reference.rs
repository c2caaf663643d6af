//! Every file of a varied media set decodes to the same shapes, frame choices, timestamps and
//! pixels as an independent reference decode with the ffmpeg CLI (PROTOCOL.md "Preprocessing"),
//! by both the scan and the seek strategy.

mod decode_support;

use datahelix::decode::{Decoder, Params, Strategy};
use decode_support::{mean_abs_diff, media_set, reference};

#[test]
fn decodes_match_the_ffmpeg_cli_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let files = media_set(dir.path());
    let params = Params::default();
    for path in &files {
        let want = reference(path);
        for strategy in [Strategy::Scan, Strategy::Seek] {
            let mut dec = Decoder::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let shape = dec.shape(&params).unwrap();
            assert_eq!(shape.dims(), want.shape, "{}: shape", path.display());
            let mut buf = vec![0u8; shape.bytes()];
            let got = dec
                .decode_into(&params, strategy, &mut buf)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(got.timestamps_s, want.timestamps_s, "{} {strategy:?}: timestamps", path.display());
            let mad = mean_abs_diff(&buf, &want.pixels);
            let identical = buf == want.pixels;
            eprintln!(
                "{} {strategy:?}: shape {:?} mad {mad:.4} identical {identical} stats {:?}",
                path.display(),
                shape.dims(),
                got.stats
            );
            assert!(mad <= 1.0, "{}: mean abs diff {mad}", path.display());
            assert!(identical, "{}: not byte-identical (mad {mad})", path.display());
        }
    }
}
