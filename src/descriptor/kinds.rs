//! The small enumerations inside a descriptor, with stable byte values (they are stored in the
//! index file) and stable names (they are printed in JSON).

macro_rules! byte_enum {
    (
        $(#[$meta:meta])*
        $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $value:literal => $word:literal ),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum $name {
            #[default]
            $( $(#[$vmeta])* $variant = $value ),+
        }

        impl $name {
            /// Every value, in byte order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The byte stored in the index.
            pub fn to_byte(self) -> u8 {
                self as u8
            }

            /// The value of a stored byte, or `None` for a byte no version of the format wrote.
            pub fn from_byte(b: u8) -> Option<Self> {
                match b {
                    $( $value => Some($name::$variant), )+
                    _ => None,
                }
            }

            /// The word printed in JSON.
            pub fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $word, )+
                }
            }

            /// The value named by a JSON word.
            pub fn from_name(word: &str) -> Option<Self> {
                match word {
                    $( $word => Some($name::$variant), )+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

byte_enum! {
    /// What kind of sample a file holds.
    Modality {
        /// Not known (the file could not be probed).
        Unknown = 0 => "unknown",
        /// A video stream.
        Video = 1 => "video",
        /// A still image.
        Image = 2 => "image",
    }
}

byte_enum! {
    /// The codec of a sample's (first) video stream or image.
    Codec {
        /// Not known.
        Unknown = 0 => "unknown",
        /// H.264 / AVC.
        H264 = 1 => "h264",
        /// MPEG-4 Part 2.
        Mpeg4 = 2 => "mpeg4",
        /// JPEG (baseline or progressive).
        Jpeg = 3 => "jpeg",
        /// PNG.
        Png = 4 => "png",
        /// H.265 / HEVC.
        Hevc = 5 => "hevc",
        /// VP9.
        Vp9 = 6 => "vp9",
        /// AV1 (decoded by the FFmpeg build's AV1 decoder, dav1d in Debian's).
        Av1 = 7 => "av1",
        /// Any other codec.
        Other = 255 => "other",
    }
}

impl Codec {
    /// Whether DataHelix decodes this codec: the protocol's set (`../shared/bench/PROTOCOL.md`,
    /// "Dataset": H.264, MPEG-4 Part 2, JPEG, PNG) and the codecs public video datasets ship in
    /// (HEVC, VP9, AV1), each with its own decode-cost model.
    pub fn is_supported(self) -> bool {
        matches!(
            self,
            Codec::H264 | Codec::Mpeg4 | Codec::Jpeg | Codec::Png | Codec::Hevc | Codec::Vp9 | Codec::Av1
        )
    }
}

byte_enum! {
    /// The file's container format.
    Container {
        /// Not known.
        Unknown = 0 => "unknown",
        /// ISO base media (MP4, MOV).
        Mp4 = 1 => "mp4",
        /// Matroska / WebM.
        Mkv = 2 => "mkv",
        /// A JPEG file.
        Jpeg = 3 => "jpeg",
        /// A PNG file.
        Png = 4 => "png",
        /// Any other container FFmpeg opened.
        Other = 255 => "other",
    }
}

byte_enum! {
    /// Whether a sample is usable, and if not, why. Non-`Ok` samples are reported skips.
    Status {
        /// Probed and usable.
        Ok = 0 => "ok",
        /// The file does not exist.
        Missing = 1 => "missing",
        /// The file has zero bytes.
        Empty = 2 => "empty",
        /// The file exists but cannot be read (permissions, a directory, an I/O error).
        Unreadable = 3 => "unreadable",
        /// The bytes are no image or video format FFmpeg knows.
        NotMedia = 4 => "not_media",
        /// The file ends before its container says it does.
        Truncated = 5 => "truncated",
        /// The container is recognised but its header is damaged.
        Corrupt = 6 => "corrupt",
        /// A codec DataHelix does not decode (MPEG-2, VP8, ...: [`Codec::is_supported`]).
        UnsupportedCodec = 7 => "unsupported_codec",
        /// A container without any video stream.
        NoVideoStream = 8 => "no_video_stream",
        /// An id that an earlier manifest line already used.
        DuplicateId = 9 => "duplicate_id",
        /// A path that is absolute or leaves the dataset folder.
        BadPath = 10 => "bad_path",
        /// Neither the stream nor the container states a duration.
        NoDuration = 11 => "no_duration",
        /// A width or height of zero, or beyond what a decoder accepts.
        BadDimensions = 12 => "bad_dimensions",
        /// A path that leads out of the dataset folder through a symbolic link.
        OutsideDataset = 13 => "outside_dataset",
    }
}

impl Status {
    /// True for [`Status::Ok`].
    pub fn is_ok(self) -> bool {
        self == Status::Ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_names_round_trip() {
        for s in Status::ALL {
            assert_eq!(Status::from_byte(s.to_byte()), Some(*s));
            assert_eq!(Status::from_name(s.name()), Some(*s));
        }
        for c in Codec::ALL {
            assert_eq!(Codec::from_byte(c.to_byte()), Some(*c));
        }
        assert_eq!(Status::from_byte(200), None);
        assert_eq!(Modality::from_name("audio"), None);
    }
}
