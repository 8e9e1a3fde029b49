//! Address vectors (FI_AV_TABLE).
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use ofi_libfabric_sys::bindgen as fi;

use super::domain::{close_fid, Domain, FiAddr};
use super::error::{check, Error, Result};

/// An address vector of type FI_AV_TABLE: inserted addresses get consecutive `fi_addr` values.
pub struct AddressVector {
    pub(super) raw: *mut fi::fid_av,
    _domain: Arc<Domain>,
}
// SAFETY: FI_THREAD_SAFE domain objects.
unsafe impl Send for AddressVector {}
// SAFETY: as above.
unsafe impl Sync for AddressVector {}

impl AddressVector {
    /// Opens an AV sized for `count` addresses.
    pub fn open(domain: &Arc<Domain>, count: usize) -> Result<Arc<AddressVector>> {
        // SAFETY: zeroed attr is valid input; fields set below.
        let mut attr: fi::fi_av_attr = unsafe { std::mem::zeroed() };
        attr.type_ = fi::fi_av_type_FI_AV_TABLE;
        attr.count = count;
        let raw = domain.open_object(fi::fi_av_open, &mut attr, "fi_av_open")?;
        Ok(Arc::new(AddressVector {
            raw,
            _domain: domain.clone(),
        }))
    }

    /// Inserts `count` raw endpoint names stored back to back (`names.len() / count` bytes each) and
    /// returns their `fi_addr` values.
    pub fn insert(&self, names: &[u8], count: usize) -> Result<Vec<FiAddr>> {
        if count == 0 || names.len() % count != 0 {
            return Err(Error::invalid(format!(
                "fi_av_insert: {} bytes for {count} names",
                names.len()
            )));
        }
        // shm names are C strings that the provider reads with strlen: a slot without a NUL would
        // make it read past the caller's buffer.
        if super::Caps::of(self._domain.info()).named_endpoints {
            let len = names.len() / count;
            if let Some(k) = (0..count).find(|k| !names[k * len..(k + 1) * len].contains(&0)) {
                return Err(Error::invalid(format!(
                    "fi_av_insert: shm name {k} is not NUL-terminated"
                )));
            }
        }
        let mut addrs = vec![u64::MAX; count];
        // SAFETY: names holds count addresses; addrs has room for count results.
        let ret = unsafe {
            fi::fi_av_insert(
                self.raw,
                names.as_ptr() as *const c_void,
                count,
                addrs.as_mut_ptr(),
                0,
                ptr::null_mut(),
            )
        };
        if ret < 0 {
            return Err(Error::from_ret(ret as i64, "fi_av_insert"));
        }
        if ret as usize != count || addrs.contains(&u64::MAX) {
            return Err(Error::invalid(format!(
                "fi_av_insert: inserted {ret} of {count} addresses"
            )));
        }
        Ok(addrs)
    }

    /// Removes one address (connection-oriented providers such as rxm close their connection to it;
    /// inserting the name again gives a fresh one).
    pub fn remove(&self, addr: FiAddr) -> Result<()> {
        let mut a = addr;
        // SAFETY: open AV; one fi_addr_t read from `a`.
        let ret = unsafe { fi::fi_av_remove(self.raw, &mut a, 1, 0) };
        check(ret as i64, || format!("fi_av_remove({addr})"))
    }

    /// The fid, for binding.
    pub(super) fn fid(&self) -> *mut fi::fid {
        // SAFETY: open AV.
        unsafe { &mut (*self.raw).fid }
    }
}

impl Drop for AddressVector {
    fn drop(&mut self) {
        close_fid(self.fid(), "av");
    }
}
