//! The published status codes (`NVSHMEM_EFA_ERROR_*`) that have an NVSHMEM counterpart carry
//! NVSHMEM's own numbers: checked against `enum nvshmemx_status` in NVSHMEM's
//! `include/non_abi/nvshmemx_error.h` under `NVSHMEM_HOME` (set by `.ci/env.sh` to the NVSHMEM wheel
//! of the CI setup). Without that header the test says why it checks nothing and passes. The codes
//! of this library's own start above NVSHMEM's range, and all are distinct.
use std::collections::BTreeMap;
use std::path::PathBuf;

use nvshmem_efa_gda::capi::*;

/// `NVSHMEMX_*` names of `enum nvshmemx_status` with their values (consecutive from the last
/// explicit value, as C numbers them).
fn nvshmem_status_enum(text: &str) -> BTreeMap<String, i64> {
    let start = text
        .find("enum nvshmemx_status")
        .expect("enum nvshmemx_status");
    let body = &text[start..];
    let body = &body[body.find('{').expect("{") + 1..body.find('}').expect("}")];
    let mut out = BTreeMap::new();
    let mut next = 0i64;
    for item in body.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (name, value) = match item.split_once('=') {
            Some((n, v)) => match v.trim().parse::<i64>() {
                Ok(v) => (n.trim(), v),
                // INT_MAX (the sentinel) and the like: not a code.
                Err(_) => continue,
            },
            None => (item, next),
        };
        out.insert(name.to_string(), value);
        next = value + 1;
    }
    out
}

#[test]
fn codes_match_nvshmem_numbering() {
    let Some(home) = std::env::var_os("NVSHMEM_HOME") else {
        println!("NVSHMEM_HOME is not set: NVSHMEM's numbering not checked");
        return;
    };
    let header = PathBuf::from(home).join("include/non_abi/nvshmemx_error.h");
    let Ok(text) = std::fs::read_to_string(&header) else {
        println!(
            "{} not readable: NVSHMEM's numbering not checked",
            header.display()
        );
        return;
    };
    let e = nvshmem_status_enum(&text);
    for (ours, theirs) in [
        (NVSHMEM_EFA_SUCCESS, "NVSHMEMX_SUCCESS"),
        (
            NVSHMEM_EFA_ERROR_INVALID_VALUE,
            "NVSHMEMX_ERROR_INVALID_VALUE",
        ),
        (
            NVSHMEM_EFA_ERROR_OUT_OF_MEMORY,
            "NVSHMEMX_ERROR_OUT_OF_MEMORY",
        ),
        (
            NVSHMEM_EFA_ERROR_NOT_SUPPORTED,
            "NVSHMEMX_ERROR_NOT_SUPPORTED",
        ),
        (NVSHMEM_EFA_ERROR_INTERNAL, "NVSHMEMX_ERROR_INTERNAL"),
    ] {
        assert_eq!(
            Some(&i64::from(ours)),
            e.get(theirs),
            "{theirs} in {}",
            header.display()
        );
    }
    let top = e.values().copied().max().unwrap();
    for own in [
        NVSHMEM_EFA_ERROR_NOT_INITIALIZED,
        NVSHMEM_EFA_ERROR_ALREADY_INITIALIZED,
        NVSHMEM_EFA_ERROR_BUFFER_TOO_SMALL,
        NVSHMEM_EFA_ERROR_NOT_FOUND,
    ] {
        assert!(
            i64::from(own) > top,
            "{own} is inside NVSHMEM's range (up to {top})"
        );
    }
}

#[test]
fn codes_are_distinct_and_positive() {
    let all = [
        NVSHMEM_EFA_ERROR_INVALID_VALUE,
        NVSHMEM_EFA_ERROR_OUT_OF_MEMORY,
        NVSHMEM_EFA_ERROR_NOT_SUPPORTED,
        NVSHMEM_EFA_ERROR_INTERNAL,
        NVSHMEM_EFA_ERROR_NOT_INITIALIZED,
        NVSHMEM_EFA_ERROR_ALREADY_INITIALIZED,
        NVSHMEM_EFA_ERROR_BUFFER_TOO_SMALL,
        NVSHMEM_EFA_ERROR_NOT_FOUND,
    ];
    let mut seen = std::collections::BTreeSet::new();
    for c in all {
        assert!(c > 0, "{c}");
        assert!(seen.insert(c), "{c} twice");
    }
}

#[test]
fn gda_errors_map_onto_published_codes() {
    use nvshmem_efa_gda::capi::gda::status_of;
    use nvshmem_efa_gda::gda::GdaError;
    let code = |c: i32| {
        status_of(&GdaError {
            code: c,
            message: String::new(),
        })
    };
    assert_eq!(
        status_of(&GdaError::invalid("x")),
        NVSHMEM_EFA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        status_of(&GdaError::unsupported("x")),
        NVSHMEM_EFA_ERROR_NOT_SUPPORTED
    );
    assert_eq!(
        status_of(&GdaError::nomem("x")),
        NVSHMEM_EFA_ERROR_OUT_OF_MEMORY
    );
    assert_eq!(status_of(&GdaError::io("x")), NVSHMEM_EFA_ERROR_INTERNAL);
    assert_eq!(
        status_of(&GdaError::not_initialised()),
        NVSHMEM_EFA_ERROR_NOT_INITIALIZED
    );
    assert_eq!(code(-libc::EALREADY), NVSHMEM_EFA_ERROR_ALREADY_INITIALIZED);
    assert_eq!(code(-libc::ENOSYS), NVSHMEM_EFA_ERROR_NOT_SUPPORTED);
    // Any other failure (libfabric, CUDA, a timeout) is INTERNAL.
    assert_eq!(code(-libc::ETIMEDOUT), NVSHMEM_EFA_ERROR_INTERNAL);
    assert_eq!(code(-libc::EAGAIN), NVSHMEM_EFA_ERROR_INTERNAL);
}
