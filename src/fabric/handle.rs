//! Non-owning handles of libfabric objects: of objects this layer opened (`handle()` of the owning
//! type) and of objects a C caller owns and passes as opaque pointers (`from_opaque`, the one place
//! such a pointer is cast to its libfabric type). A handle closes nothing.
use std::ffi::c_void;

use ofi_libfabric_sys::bindgen as fi;

macro_rules! handle {
    ($(#[$m:meta])* $name:ident, $raw:ty) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name(pub(super) *mut $raw);

        // SAFETY: a handle is an address; the objects it names belong to FI_THREAD_SAFE domains,
        // and every call through it is an `unsafe fn` whose contract says the object is open.
        unsafe impl Send for $name {}
        // SAFETY: as above.
        unsafe impl Sync for $name {}

        impl $name {
            /// The handle of the object a C caller passed as an opaque pointer; `None` for null.
            ///
            /// # Safety
            #[doc = concat!("`p`, when not null, must point to an open libfabric `", stringify!($raw), "`.")]
            pub unsafe fn from_opaque(p: *mut c_void) -> Option<$name> {
                (!p.is_null()).then_some($name(p as *mut $raw))
            }

            /// The object's address, for identity checks and logs.
            pub fn id(self) -> usize {
                self.0 as usize
            }
        }
    };
}

handle!(
    /// A domain (`struct fid_domain`).
    DomainHandle,
    fi::fid_domain
);
handle!(
    /// An endpoint (`struct fid_ep`).
    EndpointHandle,
    fi::fid_ep
);
handle!(
    /// A completion queue (`struct fid_cq`).
    CqHandle,
    fi::fid_cq
);
handle!(
    /// A memory registration (`struct fid_mr`).
    MrHandle,
    fi::fid_mr
);

impl MrHandle {
    /// Remote key of the registration.
    ///
    /// # Safety
    /// The registration must be open.
    pub unsafe fn key(self) -> u64 {
        // SAFETY: open registration per the contract.
        unsafe { fi::fi_mr_key(self.0) }
    }

    /// Local descriptor of the registration, for data-transfer calls.
    ///
    /// # Safety
    /// The registration must be open.
    pub unsafe fn desc(self) -> *mut c_void {
        // SAFETY: open registration per the contract.
        unsafe { fi::fi_mr_desc(self.0) }
    }
}
