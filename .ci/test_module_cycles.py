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

    def folder_graphs(self):
        """Folder ("a/b", "" for the root) -> child -> the children it names, children shown
        as the checker shows them (`x/` for a folder, `x.rs` for a file)."""
        crate = mc.Crate(self.root)
        return {
            "/".join(folder): {
                crate.child_label(folder, a): {crate.child_label(folder, b) for b in named}
                for a, named in children.items()
            }
            for folder, children in crate.folder_graphs().items()
        }

    def folder_cycles(self):
        """Folder -> the cycles found between its children, for the folders with any."""
        found = {f: mc.cycles(g) for f, g in self.folder_graphs().items()}
        return {f: c for f, c in found.items() if c}

    def run(self, *args):
        return subprocess.run(
            [sys.executable, CHECKER, *args, self.root], capture_output=True, text=True
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

    def assertFolderCycle(self, crate, folder, *loop):
        """That the children of `folder` ("" for the root) have the loop, in any rotation."""
        found = [c[:-1] for c in crate.folder_cycles().get(folder, [])]
        rotations = [list(loop[i:] + loop[:i]) for i in range(len(loop))]
        self.assertTrue(
            any(c in rotations for c in found),
            f"no cycle {' -> '.join(loop)} in {folder or 'the root'}: {crate.folder_cycles()}",
        )

    def assertNoFolderCycle(self, crate):
        self.assertEqual(crate.folder_cycles(), {}, crate.folder_graphs())


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


# Stages that import forward only: plan -> io -> deliver, and every stage -> state.rs, which
# names no stage. Each parent's mod.rs puts its children together and re-exports from them.
FORWARD = {
    "lib.rs": "mod pipeline;\nmod metrics;\npub type SampleId = u32;\n",
    "metrics.rs": "pub struct Collector;\n",
    "pipeline/mod.rs": """
        mod deliver;
        mod io;
        mod plan;
        mod state;

        pub(crate) use deliver::Batch;
        pub(crate) use io::order::Order;
        use crate::metrics::Collector;

        pub struct Pipeline {
            plan: plan::Planner,
            metrics: Collector,
        }
    """,
    "pipeline/state.rs": "pub struct State(pub crate::SampleId);\n",
    "pipeline/plan/mod.rs": """
        mod layout;
        pub(crate) use layout::Layout;

        use super::io::order::Order;
        use crate::pipeline::{deliver::Batch, state::State};

        pub struct Planner(Layout, Order, Batch, State);
    """,
    "pipeline/plan/layout.rs": "pub struct Layout(crate::SampleId);\n",
    "pipeline/io/mod.rs": "pub(crate) mod order;\nmod landing;\n",
    "pipeline/io/order.rs": """
        use super::landing::Landing;
        use crate::pipeline::deliver::reorder::Reorder;

        pub struct Order(Landing, Reorder, super::super::state::State);
    """,
    "pipeline/io/landing.rs": "pub struct Landing;\n",
    "pipeline/deliver/mod.rs": """
        pub(crate) mod reorder;

        pub struct Batch(reorder::Reorder, crate::pipeline::state::State);
    """,
    "pipeline/deliver/reorder.rs": "pub struct Reorder;\n",
}


class Folders(Case):
    def test_two_folders_naming_each_other(self):
        crate = self.crate(
            {
                "lib.rs": "mod a;\nmod b;\n",
                "a/mod.rs": "pub mod x;\n",
                "a/x.rs": "use crate::b::y;\npub struct X;\nfn f() { y::g() }\n",
                "b/mod.rs": "pub mod y;\n",
                "b/y.rs": "use crate::a::x;\npub fn g() -> x::X { x::X }\n",
            }
        )
        self.assertEqual(crate.folder_graphs()[""], {"a/": {"b/"}, "b/": {"a/"}})
        self.assertFolderCycle(crate, "", "a/", "b/")

    def test_two_folders_whose_files_do_not_loop(self):
        # a::x -> b::y and b::z -> a::w: no loop between files, one between their folders.
        crate = self.crate(
            {
                "lib.rs": "mod a;\nmod b;\n",
                "a/mod.rs": "pub mod w;\npub mod x;\n",
                "a/w.rs": "pub struct W;\n",
                "a/x.rs": "pub struct X(crate::b::y::Y);\n",
                "b/mod.rs": "pub mod y;\npub mod z;\n",
                "b/y.rs": "pub struct Y;\n",
                "b/z.rs": "use crate::a::w::W;\npub struct Z(W);\n",
            }
        )
        self.assertNoCycle(crate)
        self.assertFolderCycle(crate, "", "a/", "b/")
        # And nothing inside either folder: each use counts where its files part.
        self.assertEqual(crate.folder_graphs()["a"], {"w.rs": set(), "x.rs": set()})

    def test_a_file_beside_folders(self):
        # state.rs names two stage folders, and each stage names state.rs.
        crate = self.crate(
            {
                "lib.rs": "mod p;\n",
                "p/mod.rs": "mod io;\nmod plan;\nmod state;\n",
                "p/state.rs": """
                    use crate::p::io::order::Order;
                    use super::plan::progress::Progress;
                    pub struct State(Order, Progress);
                """,
                "p/io/mod.rs": "pub mod order;\nmod blocking;\n",
                "p/io/order.rs": "pub struct Order;\n",
                "p/io/blocking.rs": "fn f(_: &crate::p::state::State) {}\n",
                "p/plan/mod.rs": "pub mod progress;\n",
                "p/plan/progress.rs": "pub struct Progress;\n",
                "p/plan/read_ahead.rs": "use crate::p::state::State;\n",
            }
        )
        self.assertNoCycle(crate)
        self.assertEqual(
            crate.folder_graphs()["p"],
            {"io/": {"state.rs"}, "plan/": {"state.rs"}, "state.rs": {"io/", "plan/"}},
        )
        self.assertFolderCycle(crate, "p", "io/", "state.rs")
        self.assertFolderCycle(crate, "p", "plan/", "state.rs")

    def test_a_loop_through_a_file_and_two_folders(self):
        crate = self.crate(
            {
                "lib.rs": "mod a;\nmod b;\nmod s;\n",
                "a/mod.rs": "pub mod x;\n",
                "a/x.rs": "pub struct X(crate::s::S);\n",
                "s.rs": "pub struct S(crate::b::y::Y);\n",
                "b/mod.rs": "pub mod y;\npub mod z;\n",
                "b/y.rs": "pub struct Y;\n",
                "b/z.rs": "fn f() -> crate::a::x::X { todo!() }\n",
            }
        )
        self.assertNoCycle(crate)
        self.assertFolderCycle(crate, "", "a/", "s.rs", "b/")

    def test_super_paths(self):
        crate = self.crate(
            {
                "lib.rs": "mod m;\n",
                "m/mod.rs": "mod a;\nmod b;\n",
                "m/a/mod.rs": "mod w;\nmod x;\n",
                "m/a/w.rs": "pub struct W;\n",
                "m/a/x.rs": "use super::super::b::y::Y;\n",
                "m/b/mod.rs": "mod y;\nmod z;\n",
                "m/b/y.rs": "pub struct Y;\n",
                "m/b/z.rs": "fn f() { let _ = super::super::a::w::W; }\n",
            }
        )
        self.assertNoCycle(crate)
        self.assertEqual(crate.folder_graphs()["m"], {"a/": {"b/"}, "b/": {"a/"}})
        self.assertFolderCycle(crate, "m", "a/", "b/")

    def test_a_grouped_use(self):
        crate = self.crate(
            {
                "lib.rs": "mod m;\n",
                "m/mod.rs": "mod a;\nmod b;\nmod c;\n",
                "m/c.rs": "pub struct C;\n",
                "m/a/mod.rs": "mod w;\nmod x;\n",
                "m/a/w.rs": "pub struct W;\n",
                "m/a/x.rs": "use crate::m::{\n    c::C,\n    b::{y::Y, self},\n};\n",
                "m/b/mod.rs": "mod y;\nmod z;\n",
                "m/b/y.rs": "pub struct Y;\n",
                "m/b/z.rs": "use super::super::{a::{w::W}, c};\n",
            }
        )
        self.assertNoCycle(crate)
        self.assertEqual(
            crate.folder_graphs()["m"], {"a/": {"b/", "c.rs"}, "b/": {"a/", "c.rs"}, "c.rs": set()}
        )
        self.assertFolderCycle(crate, "m", "a/", "b/")

    def test_a_sibling_reached_through_the_parents_re_export(self):
        crate = self.crate(
            {
                "lib.rs": "mod m;\n",
                "m/mod.rs": "mod a;\nmod b;\npub(crate) use b::y::Y;\n",
                "m/a/mod.rs": "pub mod x;\n",
                "m/a/x.rs": "pub struct X(super::super::Y);\n",
                "m/b/mod.rs": "pub mod y;\nmod z;\n",
                "m/b/y.rs": "pub struct Y;\n",
                "m/b/z.rs": "use crate::m::a::x::X;\n",
            }
        )
        self.assertEqual(crate.folder_graphs()["m"], {"a/": {"b/"}, "b/": {"a/"}})
        self.assertFolderCycle(crate, "m", "a/", "b/")

    def test_forward_only_stages_pass(self):
        crate = self.crate(FORWARD)
        self.assertEqual(
            crate.folder_graphs()["pipeline"],
            {
                "plan/": {"io/", "deliver/", "state.rs"},
                "io/": {"deliver/", "state.rs"},
                "deliver/": {"state.rs"},
                "state.rs": set(),
            },
        )
        self.assertNoCycle(crate)
        self.assertNoFolderCycle(crate)
        result = crate.run()
        self.assertEqual((result.returncode, result.stdout, result.stderr), (0, "", ""))

    def test_a_parent_using_its_children_is_no_loop(self):
        files = dict(FORWARD)
        # pipeline/mod.rs already names plan, io and deliver; have plan/mod.rs name its file
        # below in every way too, and a child of pipeline name what it re-exports.
        files["pipeline/plan/mod.rs"] = files["pipeline/plan/mod.rs"] + (
            "pub use self::layout::*;\nfn f() -> layout::Layout { todo!() }\n"
        )
        files["pipeline/io/order.rs"] = files["pipeline/io/order.rs"].replace(
            "use crate::pipeline::deliver::reorder::Reorder;",
            "use crate::pipeline::deliver::reorder::Reorder;\nuse crate::pipeline::Batch;",
        )
        crate = self.crate(files)
        graphs = crate.folder_graphs()
        self.assertEqual(graphs["pipeline/plan"], {"layout.rs": set()})
        self.assertEqual(graphs["pipeline"]["io/"], {"deliver/", "state.rs"})
        self.assertNoFolderCycle(crate)
        self.assertEqual(crate.run("--level", "folders").returncode, 0)
        # Between files, io::order reads pipeline/mod.rs's imports, and pipeline names it.
        self.assertCycle(crate, "pipeline", "pipeline::io::order")

    def test_an_item_of_the_parents_own_file_is_no_edge(self):
        crate = self.crate(
            {
                "lib.rs": "mod m;\n",
                "m/mod.rs": "mod a;\nmod b;\npub struct Home(a::x::X, b::B);\n",
                "m/a/mod.rs": "pub mod x;\n",
                "m/a/x.rs": "pub struct X;\nfn f(_: &super::super::Home) {}\n",
                "m/b.rs": "pub struct B(crate::m::Home);\n",
            }
        )
        self.assertEqual(crate.folder_graphs()["m"], {"a/": set(), "b.rs": set()})
        self.assertNoFolderCycle(crate)
        # Parent and child loop, which the file check finds.
        self.assertCycle(crate, "m", "m::b")

    def test_a_folder_beside_its_file(self):
        # `a.rs` with `a/` beside it (no mod.rs) is the folder `a/` too.
        crate = self.crate(
            {
                "main.rs": "mod a;\nmod s;\n",
                "a.rs": "mod x;\n",
                "a/x.rs": "pub struct X(crate::s::S);\n",
                "s.rs": "pub struct S;\nfn f(_: crate::a::x::X) {}\n",
            }
        )
        self.assertFolderCycle(crate, "", "a/", "s.rs")

    def test_test_code_does_not_count(self):
        crate = self.crate(
            {
                "lib.rs": "mod a;\nmod b;\n",
                "a/mod.rs": "pub mod x;\n#[cfg(test)]\nmod tests;\n",
                "a/x.rs": "pub struct X(crate::b::y::Y);\n",
                "a/tests.rs": "use crate::b::*;\n",
                "b/mod.rs": "pub mod y;\n",
                "b/y.rs": "pub struct Y;\n#[cfg(test)]\nmod tests { use crate::a::x::X; }\n",
            }
        )
        self.assertEqual(crate.folder_graphs()[""], {"a/": {"b/"}, "b/": set()})
        self.assertNoFolderCycle(crate)

    def test_the_planted_pipeline_loop_is_one_between_folders_too(self):
        self.assertFolderCycle(self.crate(PIPELINE), "", "holders.rs", "pipeline/")


class Script(Case):
    def test_an_acyclic_crate_passes(self):
        files = dict(PIPELINE)
        files["pipeline/mod.rs"] = "mod layout;\nmod peers;\n"
        result = self.crate(files).run("--level", "files")
        self.assertEqual((result.returncode, result.stdout, result.stderr), (0, "", ""))

    def test_a_cycle_fails_and_is_printed(self):
        crate = self.crate(PIPELINE)
        result = crate.run("--level", "files")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(
            result.stdout,
            f"{crate.root}: import cycle: holders -> pipeline -> pipeline::peers -> holders\n",
        )

    def test_a_folder_cycle_fails_and_is_printed_with_a_use_per_edge(self):
        crate = self.crate(
            {
                "lib.rs": "mod p;\n",
                "p/mod.rs": "mod io;\nmod plan;\n",
                "p/io/mod.rs": "mod order;\nmod blocking;\n",
                "p/io/order.rs": """
                    // The split of a budget.
                    use super::super::plan::allocate::equal_split;
                    fn f() { super::super::plan::allocate::equal_split(); }
                """,
                "p/io/blocking.rs": "pub struct OnWorker;\n",
                "p/plan/mod.rs": "mod allocate;\nmod read_ahead;\n",
                "p/plan/allocate.rs": "pub fn equal_split() {}\n",
                "p/plan/read_ahead.rs": "\nfn f(_: crate::p::io::blocking::OnWorker) {}\n",
            }
        )
        folders = crate.run("--level", "folders")
        self.assertEqual(folders.returncode, 1, folders.stderr)
        p = os.path.join(crate.root, "p")
        self.assertEqual(
            folders.stdout,
            f"{p}: folder import cycle: io/ -> plan/ -> io/\n"
            f"    io/ -> plan/: {p}/io/order.rs:3 names "
            "super::super::plan::allocate::equal_split (1 of 2 uses)\n"
            f"    plan/ -> io/: {p}/plan/read_ahead.rs:2 names "
            "crate::p::io::blocking::OnWorker\n",
        )
        # The files do not loop: only the folder check fails, and by default both run.
        files = crate.run("--level", "files")
        self.assertEqual((files.returncode, files.stdout), (0, ""))
        both = crate.run()
        self.assertEqual((both.returncode, both.stdout), (1, folders.stdout))

    def test_both_levels_by_default(self):
        crate = self.crate(PIPELINE)
        result = crate.run()
        self.assertEqual(result.returncode, 1, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual(
            lines[0],
            f"{crate.root}: import cycle: holders -> pipeline -> pipeline::peers -> holders",
        )
        self.assertEqual(
            lines[1], f"{crate.root}: folder import cycle: holders.rs -> pipeline/ -> holders.rs"
        )

    def test_a_missing_directory_is_an_error(self):
        result = subprocess.run(
            [sys.executable, CHECKER, "/nonexistent/src"], capture_output=True, text=True
        )
        self.assertEqual(result.returncode, 2)
        self.assertIn("/nonexistent/src is not a directory", result.stderr)


if __name__ == "__main__":
    unittest.main()
