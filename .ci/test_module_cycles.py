#!/usr/bin/env python3
"""Tests of module_cycles.py on small fake crates. Run: python3 .ci/test_module_cycles.py"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "module_cycles.py")
spec = importlib.util.spec_from_file_location("module_cycles", CHECKER)
mc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mc)

# The real case from crates/lobster: holders names `Layout` through pipeline's re-export, and
# pipeline::peers names holders. holders reads pipeline/mod.rs's imports, which name peers,
# which names holders: a loop the checker once missed (bare `use peers::..` in mod.rs).
PIPELINE = {
    "lib.rs": "mod holders;\nmod pipeline;\n",
    "holders.rs": """
        use crate::pipeline::Layout;

        pub struct PeerPlan;
        pub struct X;
        pub fn plan(layout: &Layout) -> PeerPlan { PeerPlan }
    """,
    "pipeline/mod.rs": """
        mod layout;
        mod peers;

        pub(crate) use layout::Layout;
        pub(crate) use peers::Peers;
    """,
    "pipeline/peers.rs": """
        use crate::holders::PeerPlan;

        pub struct Peers { plan: PeerPlan }
    """,
    "pipeline/layout.rs": "pub struct Layout;\n",
}


class Crate:
    """A fake crate's src directory in a temporary directory."""

    def __init__(self, test, files):
        self.tmp = tempfile.TemporaryDirectory()
        test.addCleanup(self.tmp.cleanup)
        self.root = os.path.join(self.tmp.name, "src")
        for rel, text in files.items():
            path = os.path.join(self.root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(textwrap.dedent(text))

    def graph(self):
        return mc.Crate(self.root).graph()

    def cycles(self):
        return mc.cycles(self.graph())

    def run(self):
        return subprocess.run(
            [sys.executable, CHECKER, self.root], capture_output=True, text=True
        )


class Case(unittest.TestCase):
    def crate(self, files):
        return Crate(self, files)

    def assertCycle(self, crate, *loop):
        """That the crate has the loop, in any rotation."""
        found = [c[:-1] for c in crate.cycles()]
        rotations = [list(loop[i:] + loop[:i]) for i in range(len(loop))]
        self.assertTrue(
            any(c in rotations for c in found), f"no cycle {' -> '.join(loop)} in {found}"
        )

    def assertLoopThrough(self, crate, *modules):
        """That some cycle found passes through every one of `modules`."""
        found = crate.cycles()
        self.assertTrue(
            any(set(modules) <= set(c) for c in found), f"no cycle through {modules} in {found}"
        )

    def assertNoCycle(self, crate):
        self.assertEqual(crate.cycles(), [], crate.graph())


class ReExports(Case):
    def test_the_planted_pipeline_loop_is_found(self):
        crate = self.crate(PIPELINE)
        graph = crate.graph()
        # Through the re-export: the file that defines `Layout`, and the file whose imports
        # hold the name.
        self.assertEqual(graph["holders"], {"pipeline", "pipeline::layout"})
        self.assertEqual(graph["pipeline"], {"pipeline::layout", "pipeline::peers"})
        self.assertEqual(graph["pipeline::peers"], {"holders"})
        self.assertCycle(crate, "holders", "pipeline", "pipeline::peers")

    def test_naming_the_defining_file_breaks_the_loop(self):
        files = dict(PIPELINE)
        files["pipeline/mod.rs"] = files["pipeline/mod.rs"].replace(
            "mod layout;", "pub(crate) mod layout;"
        )
        files["holders.rs"] = files["holders.rs"].replace(
            "use crate::pipeline::Layout;", "use crate::pipeline::layout::Layout;"
        )
        crate = self.crate(files)
        self.assertEqual(crate.graph()["holders"], {"pipeline::layout"})
        self.assertNoCycle(crate)

    def test_a_loop_through_the_re_exported_layout(self):
        files = dict(PIPELINE)
        files["pipeline/layout.rs"] = "use crate::holders::X;\npub struct Layout(X);\n"
        self.assertLoopThrough(self.crate(files), "holders", "pipeline::layout")

    def test_a_loop_through_the_re_exported_peers(self):
        files = dict(PIPELINE)
        files["holders.rs"] = files["holders.rs"].replace(
            "use crate::pipeline::Layout;", "use crate::pipeline::{Layout, Peers};"
        )
        crate = self.crate(files)
        self.assertEqual(
            crate.graph()["holders"], {"pipeline", "pipeline::layout", "pipeline::peers"}
        )
        self.assertLoopThrough(crate, "holders", "pipeline::peers")

    def test_a_chain_of_re_exports_and_renames(self):
        crate = self.crate(
            {
                "lib.rs": "mod a;\nmod b;\n",
                "a.rs": "pub use crate::b::Shown as Again;\n",
                "b/mod.rs": "mod c;\nmod d;\npub use self::{c::Deep as Shown, d::Other};\n",
                "b/c/mod.rs": "mod e;\npub use e::Deep;\n",
                "b/c/e.rs": "pub struct Deep;\n",
                "b/d.rs": "pub struct Other;\n",
                "user.rs": "use crate::a::Again;\nfn f() -> crate::b::Other { todo!() }\n",
            }
        )
        graph = crate.graph()
        # The file that defines what is named, and every re-exporter on the way.
        self.assertEqual(graph["a"], {"b", "b::c", "b::c::e"})
        self.assertEqual(graph["user"], {"a", "b", "b::c", "b::c::e", "b::d"})
        self.assertEqual(graph["b"], {"b::c", "b::c::e", "b::d"})
        self.assertNoCycle(crate)

    def test_a_glob_re_export_resolves_to_its_source(self):
        crate = self.crate(
            {
                "lib.rs": "mod a;\nmod m;\n",
                "m/mod.rs": "mod inner;\npub use inner::*;\n",
                "m/inner.rs": "use crate::a::A;\npub struct Made;\n",
                "a.rs": "pub struct A;\npub fn f() -> crate::m::Made { todo!() }\n",
            }
        )
        self.assertEqual(crate.graph()["a"], {"m", "m::inner"})
        self.assertLoopThrough(crate, "a", "m::inner")

    def test_a_re_export_of_an_extern_crate_names_no_module(self):
        crate = self.crate(
            {
                "lib.rs": "mod a;\nmod m;\n",
                "m/mod.rs": "mod kid;\npub use lobster_cache::Form;\nuse kid::K;\n",
                "m/kid.rs": "use super::Form;\npub struct K(Form);\n",
                "a.rs": "use crate::m::Form;\n",
            }
        )
        graph = crate.graph()
        self.assertEqual(graph["a"], set())
        self.assertEqual(graph["m::kid"], set())
        self.assertNoCycle(crate)


class ParentsAndChildren(Case):
    FAMILY = {
        "lib.rs": "mod m;\n",
        "m/mod.rs": """
            mod a;
            mod b;
            pub use a::A;
            pub(crate) use b::B;

            pub struct Home;
        """,
        "m/a.rs": "use super::B;\npub struct A(B);\n",
        "m/b.rs": "pub struct B;\n",
    }

    def test_super_name_re_exported_from_a_sibling_is_read_through_the_parent(self):
        crate = self.crate(self.FAMILY)
        graph = crate.graph()
        self.assertEqual(graph["m"], {"m::a", "m::b"})
        # `super::B` reads the parent's imports, and the parent names this child.
        self.assertEqual(graph["m::a"], {"m", "m::b"})
        self.assertCycle(crate, "m", "m::a")

    def test_a_sibling_named_by_its_own_path_is_no_loop(self):
        files = dict(self.FAMILY)
        files["m/a.rs"] = "use super::b::B;\npub struct A(B);\n"
        crate = self.crate(files)
        self.assertEqual(crate.graph()["m::a"], {"m::b"})
        self.assertNoCycle(crate)

    def test_super_name_defined_in_the_parent_is_the_parent(self):
        files = dict(self.FAMILY)
        files["m/a.rs"] = "use super::{Home, B};\npub struct A(B, Home);\n"
        crate = self.crate(files)
        self.assertEqual(crate.graph()["m::a"], {"m", "m::b"})
        self.assertCycle(crate, "m", "m::a")

    def test_two_files_naming_each_other_through_super(self):
        crate = self.crate(
            {
                "lib.rs": "mod m;\n",
                "m/mod.rs": "mod a;\nmod b;\n",
                "m/a.rs": "use super::b::B;\npub struct A;\n",
                "m/b.rs": "pub struct B;\nfn f() { let _ = super::a::A; }\n",
            }
        )
        self.assertEqual(crate.graph()["m"], set())  # `mod a;` alone is no import
        self.assertCycle(crate, "m::a", "m::b")

    def test_super_super(self):
        crate = self.crate(
            {
                "lib.rs": "mod x;\n",
                "x/mod.rs": "mod w;\nmod y;\n",
                "x/w.rs": "pub struct W;\npub fn f() { crate::x::y::z::g() }\n",
                "x/y/mod.rs": "pub mod z;\n",
                "x/y/z.rs": "use super::super::w::W;\npub fn g() {}\n",
            }
        )
        self.assertEqual(crate.graph()["x::y::z"], {"x::w"})
        self.assertCycle(crate, "x::w", "x::y::z")

    def test_self_child(self):
        crate = self.crate(
            {
                "lib.rs": "mod m;\n",
                "m/mod.rs": "mod c;\nuse self::c::C;\npub(crate) fn helper() {}\n",
                "m/c.rs": "pub struct C;\nfn f() { super::helper() }\n",
            }
        )
        self.assertCycle(crate, "m", "m::c")

    def test_bare_child_paths_in_expressions_and_types(self):
        crate = self.crate(
            {
                "lib.rs": "mod m;\n",
                "m/mod.rs": """
                    pub(crate) mod c;
                    pub mod d;

                    pub(crate) fn helper() {}

                    fn run(x: d::Thing) -> Vec<c::Out> {
                        c::go(d::Thing::new(), std::mem::take(&mut Vec::<c::Out>::new()))
                    }
                """,
                "m/c.rs": "pub struct Out;\npub fn go() { super::helper() }\n",
                "m/d.rs": "pub struct Thing;\n",
            }
        )
        self.assertEqual(crate.graph()["m"], {"m::c", "m::d"})
        self.assertCycle(crate, "m", "m::c")

    def test_bare_use_of_a_child_in_lib_rs_is_not_counted_for_the_root(self):
        crate = self.crate(
            {
                "lib.rs": "mod a;\npub use a::A;\npub type Id = u32;\n",
                "a.rs": "pub struct A(crate::Id);\n",
            }
        )
        self.assertEqual(crate.graph(), {"a": set()})
        self.assertNoCycle(crate)


class Loops(Case):
    def test_three_files(self):
        crate = self.crate(
            {
                "lib.rs": "mod a;\nmod b;\nmod c;\n",
                "a.rs": "use crate::b::B;\npub struct A;\n",
                "b.rs": "pub struct B;\nfn f() { crate::c::g(); }\n",
                "c.rs": "pub fn g() -> crate::a::A { todo!() }\n",
            }
        )
        self.assertCycle(crate, "a", "b", "c")

    def test_through_an_inline_module(self):
        crate = self.crate(
            {
                "lib.rs": "mod a;\nmod b;\n",
                "a.rs": "pub struct A;\nmod inner {\n    use super::super::b::B;\n}\n",
                "b.rs": "pub struct B;\nuse crate::a::A;\n",
            }
        )
        self.assertCycle(crate, "a", "b")

    def test_through_a_use_imported_module(self):
        crate = self.crate(
            {
                "lib.rs": "mod a;\nmod b;\n",
                "a.rs": "use crate::b;\nfn f() { b::g() }\npub struct A;\n",
                "b.rs": "pub fn g() {}\nfn h() -> crate::a::A { todo!() }\n",
            }
        )
        self.assertCycle(crate, "a", "b")


class NotCode(Case):
    def test_comments_strings_and_tests_do_not_count(self):
        crate = self.crate(
            {
                "lib.rs": "mod a;\nmod b;\n",
                "a.rs": "pub struct A;\nuse crate::b::B;\n",
                "b.rs": r'''
                    //! Docs that name [`crate::a::A`].
                    pub struct B<'a>(&'a str);

                    // use crate::a::A;
                    /* crate::a::A /* nested */ crate::a::A */
                    /// See [`super::a::A`].
                    fn f<'a>(s: &'a str) -> &'static str {
                        let _ = ('"', '\'', b'\\', "crate::a::A \" crate::a::A");
                        let _ = r#"crate::a::A "still" a string"#;
                        'outer: loop { break 'outer; }
                        "x"
                    }

                    #[cfg(test)]
                    use crate::a::A;

                    #[cfg(test)]
                    #[allow(dead_code)]
                    fn helper() -> crate::a::A { todo!() }

                    #[cfg(test)]
                    mod tests {
                        use super::*;
                        use crate::a::A;

                        #[test]
                        fn t() { let _ = crate::a::A; }
                    }
                ''',
            }
        )
        self.assertEqual(crate.graph()["b"], set())
        self.assertNoCycle(crate)

    def test_a_test_only_file_module_does_not_count(self):
        crate = self.crate(
            {
                "lib.rs": "mod a;\n",
                "a/mod.rs": "mod real;\n#[cfg(test)]\nmod tests;\nuse real::R;\n",
                "a/real.rs": "pub struct R;\n",
                "a/tests.rs": "use super::real::R;\nuse crate::a::*;\n",
            }
        )
        self.assertEqual(crate.graph(), {"a": {"a::real"}, "a::real": set()})

    def test_cfg_not_test_still_counts(self):
        crate = self.crate(
            {
                "lib.rs": "mod a;\nmod b;\n",
                "a.rs": "pub struct A;\nuse crate::b::B;\n",
                "b.rs": "pub struct B;\n#[cfg(not(test))]\nuse crate::a::A;\n",
            }
        )
        self.assertCycle(crate, "a", "b")


class Script(Case):
    def test_an_acyclic_crate_passes(self):
        files = dict(PIPELINE)
        files["pipeline/mod.rs"] = "mod layout;\nmod peers;\n"
        result = self.crate(files).run()
        self.assertEqual((result.returncode, result.stdout, result.stderr), (0, "", ""))

    def test_a_cycle_fails_and_is_printed(self):
        crate = self.crate(PIPELINE)
        result = crate.run()
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(
            result.stdout,
            f"{crate.root}: import cycle: holders -> pipeline -> pipeline::peers -> holders\n",
        )


if __name__ == "__main__":
    unittest.main()
