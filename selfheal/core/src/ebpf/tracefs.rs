//! The classic tracepoints' record layout, from a tracefs event's `format`
//! file: the offset of one field. Reading the file is the edge's
//! (`selfheal::ebpf::tracefs`).

/// Finds `field:<type> <field>;\toffset:<n>;` in a format file.
pub fn parse_field_offset(format: &str, field: &str) -> Option<u64> {
    format.lines().find_map(|line| {
        let mut parts = line.trim().split(';').map(str::trim);
        let decl = parts.next()?.strip_prefix("field:")?;
        let name = decl.rsplit([' ', '*']).next()?;
        if name != field {
            return None;
        }
        parts.find_map(|p| p.strip_prefix("offset:"))?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOCK_RECV_LENGTH: &str = "name: sock_recv_length\nID: 2283\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
\tfield:void * sk;\toffset:8;\tsize:8;\tsigned:0;\n\
\tfield:__u16 protocol;\toffset:18;\tsize:2;\tsigned:0;\n\
\tfield:int ret;\toffset:20;\tsize:4;\tsigned:1;\n\n\
print fmt: \"sk address = %p\", REC->sk\n";

    #[test]
    fn finds_field_offsets() {
        for (field, offset) in [
            ("sk", Some(8)),
            ("protocol", Some(18)),
            ("ret", Some(20)),
            ("common_pid", Some(4)),
            ("flags", None),
            ("", None),
        ] {
            assert_eq!(
                parse_field_offset(SOCK_RECV_LENGTH, field),
                offset,
                "{field}"
            );
        }
    }

    #[test]
    fn garbage_is_none_not_a_panic() {
        for text in [
            "",
            "field:",
            "field:;offset:x;",
            "\u{0}\u{ffff}",
            "field:int ret;\toffset:;",
        ] {
            assert_eq!(parse_field_offset(text, "ret"), None, "{text:?}");
        }
    }
}
