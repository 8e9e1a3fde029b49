#[path = "fabric_common.rs"]
mod common;
use common::*;
use nvshmem_efa_gda::fabric::sys;
use std::time::Duration;

#[test]
fn exp_child() {
    let Some(env) = ChildEnv::from_env() else {
        return;
    };
    let window: usize = std::env::var("EXP_WINDOW").unwrap().parse().unwrap();
    let ops: usize = std::env::var("EXP_OPS").unwrap().parse().unwrap();
    let mut node = Node::open(&env.provider, env.rank, env.nranks, &env.dir, 1 << 20);
    node.exchange();
    node.barrier("init");
    let desc = node.desc();
    let (dst, key) = (node.peers[0].fi_addr, node.peers[0].key);
    if env.rank != 0 {
        if std::env::var("EXP_SUM").is_ok() {
            let mut ctxs = Vec::new();
            for j in 0..64 {
                node.write_u64(1024 + 8 * j, env.rank as u64 * 1000 + j as u64);
                let b = node.at(1024 + 8 * j, 8);
                let raddr = node.raddr(0, 65536 + 64);
                let r = node.at(2048 + 8 * j, 8);
                let fetch = std::env::var("EXP_SUM_FETCH").is_ok();
                ctxs.push(node.post("sum", |ep, ctx| unsafe {
                    if let Ok(f) = std::env::var("EXP_SUM_MSGFLAGS") {
                        let ioc = sys::fi_ioc {
                            addr: b as *mut _,
                            count: 1,
                        };
                        let rioc = sys::fi_rma_ioc {
                            addr: raddr,
                            count: 1,
                            key,
                        };
                        let mut d = desc;
                        let msg = sys::fi_msg_atomic {
                            msg_iov: &ioc,
                            desc: &mut d,
                            iov_count: 1,
                            addr: dst,
                            rma_iov: &rioc,
                            rma_iov_count: 1,
                            datatype: sys::fi_datatype_FI_UINT64,
                            op: sys::fi_op_FI_SUM,
                            context: ctx,
                            data: 0,
                        };
                        let r = sys::fi_atomicmsg(ep.as_ptr(), &msg, f.parse().unwrap());
                        if r == 0 {
                            Ok(())
                        } else {
                            Err(nvshmem_efa_gda::fabric::Error::from_ret(
                                r as i64,
                                "atomicmsg",
                            ))
                        }
                    } else if fetch {
                        ep.fetch_atomic(
                            b,
                            desc,
                            r,
                            desc,
                            dst,
                            raddr,
                            key,
                            sys::fi_datatype_FI_UINT64,
                            sys::fi_op_FI_SUM,
                            ctx,
                        )
                    } else {
                        ep.atomic(
                            b,
                            desc,
                            dst,
                            raddr,
                            key,
                            sys::fi_datatype_FI_UINT64,
                            sys::fi_op_FI_SUM,
                            ctx,
                        )
                    }
                }));
            }
            node.wait_all_ok("sum", &ctxs);
        }
        node.write_u64(0, 1);
        let one = node.at(0, 8);
        let raddr = node.raddr(0, 65536);
        let mut res = Vec::new();
        let mut j = 0;
        while j < ops {
            let mut ctxs = Vec::new();
            for k in 0..window.min(ops - j) {
                let r = node.at(4096 + 8 * (j + k), 8);
                ctxs.push(node.post("fetch", |ep, ctx| unsafe {
                    ep.fetch_atomic(
                        one,
                        desc,
                        r,
                        desc,
                        dst,
                        raddr,
                        key,
                        sys::fi_datatype_FI_UINT64,
                        sys::fi_op_FI_SUM,
                        ctx,
                    )
                }));
            }
            node.wait_all_ok("fetch", &ctxs);
            j += ctxs.len();
        }
        for j in 0..ops {
            res.push(node.read_u64(4096 + 8 * j));
        }
        println!("rank {} results {:?}", env.rank, res);
    }
    node.barrier("done");
    if env.rank == 0 {
        println!(
            "word {} sum {}",
            node.read_u64(65536),
            node.read_u64(65536 + 64)
        );
    }
    node.barrier("end");
    println!("{}", ok_marker(env.rank));
}

#[test]
fn exp() {
    let Ok(n) = std::env::var("EXP_N") else {
        return;
    };
    let n: usize = n.parse().unwrap();
    let dir = TempDir::new("exp");
    let specs = (0..n)
        .map(|rank| ChildSpec {
            rank,
            env: vec![],
            prefix: vec![],
        })
        .collect();
    let r = std::panic::catch_unwind(|| {
        run_children(
            "exp_child",
            dir.path(),
            n,
            &std::env::var("EXP_PROV").unwrap(),
            specs,
            Duration::from_secs(60),
        )
    });
    for r in 0..n {
        println!(
            "{}",
            std::fs::read_to_string(dir.path().join(format!("rank{r}.log"))).unwrap()
        );
    }
    r.unwrap();
}
