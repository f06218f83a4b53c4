//! Property test: random operation sequences on the volume and on a simple model give
//! the same results and the same tree, also after a remount; fsck stays clean.

mod common;
use common::*;
use proptest::prelude::*;
use zcfs_volume::*;

fn path() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "x", "y", "a", "b", "a/x", "a/y", "a/b", "b/x", "a/b/x", "a/b/y", "b/a",
    ])
    .prop_map(String::from)
}

fn op() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => path().prop_map(Step::Create),
        2 => path().prop_map(Step::Mkdir),
        1 => (path(), path()).prop_map(|(p, t)| Step::Symlink(p, t)),
        4 => (path(), 0u64..20000, 1usize..9000, any::<u8>()).prop_map(|(p, o, l, s)| Step::Write(p, o, l, s)),
        2 => (path(), 0u64..20000).prop_map(|(p, s)| Step::Truncate(p, s)),
        3 => (path(), path(), prop::sample::select(vec![0u32, 0, 1, 2])).prop_map(|(a, b, f)| Step::Rename(a, b, f)),
        1 => (path(), path()).prop_map(|(a, b)| Step::Link(a, b)),
        2 => path().prop_map(Step::Unlink),
        1 => path().prop_map(Step::Rmdir),
        1 => (path(), 0u32..0o7777).prop_map(|(p, m)| Step::Chmod(p, m)),
        1 => (path(), 0u32..3, 0u32..3).prop_map(|(p, u, g)| Step::Chown(p, u, g)),
        1 => (path(), prop::sample::select(vec!["user.a", "user.b"]), prop::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(p, k, v)| Step::SetXattr(p, k.into(), v)),
        1 => (path(), prop::sample::select(vec!["user.a", "user.b"])).prop_map(|(p, k)| Step::RemoveXattr(p, k.into())),
        1 => (path(), 0u64..16000, 1u64..9000).prop_map(|(p, o, l)| Step::PunchHole(p, o, l)),
        1 => (path(), 0u64..16000, 1u64..9000, prop::sample::select(vec![0, 1, 16, 17]))
            .prop_map(|(p, o, l, m)| Step::Fallocate(p, o, l, m)),
        1 => path().prop_map(Step::Fsync),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    #[test]
    fn volume_matches_model(ops in prop::collection::vec(op(), 1..60), batched in any::<bool>()) {
        let cfg = if batched { VolumeConfig::default() } else { VolumeConfig::synchronous() };
        let vol = memory_volume(8 << 20, cfg.clone());
        let mut model = Model::new();
        for (i, op) in ops.iter().enumerate() {
            let want = model.apply(op);
            let got = apply_volume(&vol, op);
            prop_assert_eq!(got, want, "op {} {:?}", i, op);
        }
        prop_assert_eq!(dump_volume(&vol).unwrap(), model.dump());
        let report = zcfs_volume::fsck::check_volume(&vol);
        prop_assert!(report.is_clean(), "{:?}", report.problems);
        // Remount from the image: the same tree.
        vol.sync().unwrap();
        let img = image_of(&vol);
        vol.abandon();
        let again = Volume::open_region(Region::from_image(&img), cfg).unwrap();
        prop_assert_eq!(dump_volume(&again).unwrap(), model.dump());
        let report = zcfs_volume::fsck::check_volume(&again);
        prop_assert!(report.is_clean(), "{:?}", report.problems);
    }
}
