//! `Dataset::open_image_folder` against torchvision's `ImageFolder` on a fixture tree with
//! stray files, nested and symlinked directories, upper-case extensions and hidden files
//! (the tree: data/imagefolder_tree.json; torchvision's listing of it, with its provenance:
//! data/torchvision_imagefolder.json, written by data/torchvision_imagefolder.py).

use std::path::Path;

use lobster_io::Dataset;
use serde_json::Value;

fn data(name: &str) -> Value {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the fixture {path} is required: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Builds what `spec` lists under `root`, as the Python script does.
fn build(root: &Path, spec: &Value) {
    let list = |key: &str| spec[key].as_array().cloned().unwrap_or_default();
    for f in list("files") {
        let path = root.join(f["path"].as_str().unwrap());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let bytes: Vec<u8> = (0..f["bytes"].as_u64().unwrap())
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(path, bytes).unwrap();
    }
    for d in list("dirs") {
        std::fs::create_dir_all(root.join(d.as_str().unwrap())).unwrap();
    }
    for link in list("symlinks") {
        let path = root.join(link["path"].as_str().unwrap());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(link["target"].as_str().unwrap(), path).unwrap();
    }
}

#[test]
fn ids_labels_and_classes_equal_torchvision_image_folder() {
    let (spec, want) = (
        data("imagefolder_tree.json"),
        data("torchvision_imagefolder.json"),
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    build(&root, &spec);
    let ds = Dataset::open_image_folder(&root).unwrap();
    let classes: Vec<&str> = want["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(ds.classes(), classes);
    let got: Vec<(String, u64, u64)> = ds
        .samples()
        .iter()
        .map(|s| {
            let rel = s.path.strip_prefix(&root).unwrap();
            (
                rel.to_str().unwrap().to_owned(),
                s.label.into(),
                s.size_bytes,
            )
        })
        .collect();
    let expected: Vec<(String, u64)> = want["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s[0].as_str().unwrap().to_owned(), s[1].as_u64().unwrap()))
        .collect();
    assert_eq!(
        got.iter()
            .map(|(p, l, _)| (p.clone(), *l))
            .collect::<Vec<_>>(),
        expected
    );
    // Ids are positions; sizes are the files' (through symlinks too).
    assert!(ds
        .samples()
        .iter()
        .enumerate()
        .all(|(i, s)| s.id as usize == i));
    assert!(got.iter().all(|(_, _, size)| *size > 0));
}

#[test]
fn classes_without_a_valid_file_are_refused_as_torchvision_refuses_them() {
    let (spec, want) = (
        data("imagefolder_tree.json"),
        data("torchvision_imagefolder.json"),
    );
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), &spec);
    build(dir.path(), &spec["empty_classes"]);
    let err = Dataset::open_image_folder(dir.path())
        .unwrap_err()
        .to_string();
    // torchvision: "Found no valid file for the classes A, B. Supported extensions are: ..."
    let theirs = want["empty_classes_error"].as_str().unwrap();
    let named = |s: &str| {
        let from = s.find("classes ").unwrap() + "classes ".len();
        s[from..].split(['.', ';']).next().unwrap().to_owned()
    };
    assert_eq!(named(&err), named(theirs), "ours: {err}\ntheirs: {theirs}");
    let extensions = |s: &str| s.split("are: ").nth(1).unwrap().trim().to_owned();
    assert_eq!(extensions(&err), extensions(theirs));
}
