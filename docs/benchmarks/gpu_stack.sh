#!/usr/bin/env bash
# On the GPU host: install the offline bundle gathered in PARTS_DIR (../shared/gpu/README.md), with
# transformer-engine-torch unpacked from an earlier session's build where one for this bundle, torch and GPU
# architecture is given. The bundle's installer builds that extension from source every time (71-135 s of a
# session's 30 device minutes); the build is a 5.6 MB library plus its metadata (1.7 MB packed).
#
#   usage: gpu_stack.sh PARTS_DIR INSTALLER [PREBUILT_TGZ ...]
#
# INSTALLER: the bundle's install_bundle.sh (it rides in the last part). PREBUILT_TGZ: any number of files; the one
# named te-torch-<its version>-torch-<torch version>-sm<CUDA_ARCHS>.tgz is used (the torch version with every
# character other than letters, digits and '.' as '-': files from $OUT come back only so named; CUDA_ARCHS as the
# installer takes it, default 90). With it the wheels go in as the bundle's installer puts them and the build's files
# are unpacked beside them; where that fails, or no such file is given, the bundle's installer runs (wheels and
# build), and with $OUT set a build that imports is saved there under that name for the next session: keep it beside
# the bundle's last part (.gpu-bundle-tmp/p33/). Exits 1 unless transformer_engine.pytorch and Megatron Bridge's
# training import at the end.
set -euo pipefail
parts=${1:?usage: gpu_stack.sh PARTS_DIR INSTALLER [PREBUILT_TGZ ...]}
installer=${2:?usage: gpu_stack.sh PARTS_DIR INSTALLER [PREBUILT_TGZ ...]}
archs=${CUDA_ARCHS:-90}
t0=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat "$parts"/part.* | tar xf - -C "$work"
te_sdist=$(ls "$work"/wh/transformer_engine_torch-*.tar.gz)
te_version=${te_sdist##*/transformer_engine_torch-}
te_version=${te_version%.tar.gz}
torch_tag=$(python3 -c "import torch; print(torch.__version__)" | tr -c 'A-Za-z0-9.\n' '-')
name="te-torch-$te_version-torch-$torch_tag-sm$archs.tgz"
prebuilt=""
for file in "${@:3}"; do
  if [ "$(basename "$file")" = "$name" ] && [ -f "$file" ]; then prebuilt=$file; fi
done
te_imports() { python3 -c "import torch, transformer_engine.pytorch" > /dev/null; }

install_with_prebuilt() {  # errexit is off in a condition: each step returns its failure
  # the wheels as install_bundle.sh installs them (it has no switch to leave out its build)
  (cd "$work/wh" && python3 -m pip install -q --no-index --no-deps --no-build-isolation antlr4-python3-runtime-*.tar.gz \
    && { python3 -m pip install -q --no-index --no-deps ./*.whl 2>&1 | grep -v '^WARNING' || true; }) || return 1
  tar xzf "$prebuilt" -C "$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")" || return 1
  te_imports
}

save_build() {  # the installed files of transformer-engine-torch, as pip lists them, relative to its location
  local location files
  location=$(python3 -m pip show transformer-engine-torch | sed -n 's/^Location: //p') && [ -n "$location" ] \
    && files=$(python3 -m pip show -f transformer-engine-torch | sed -n '/^Files:/,$p' | tail -n +2 | sed 's/^ *//') \
    && [ -n "$files" ] && tar czf "$OUT/.$name.partial" -C "$location" $files \
    && mv "$OUT/.$name.partial" "$OUT/$name" \
    && echo "saved the build as \$OUT/$name ($(du -h "$OUT/$name" | cut -f1))"
}

if [ -n "$prebuilt" ] && install_with_prebuilt; then
  echo "wheels installed, transformer-engine-torch unpacked from $prebuilt: $(( $(date +%s) - t0 )) s"
else
  echo "no usable $name among the files given: the bundle's installer builds it"
  bash "$installer" "$parts" "$archs"
  if [ -n "${OUT:-}" ] && te_imports; then
    save_build || { rm -f "$OUT/.$name.partial"; echo "could not save the build of transformer-engine-torch"; }
  fi
fi
te_imports || { echo "transformer_engine.pytorch does not import: the install failed" >&2; exit 1; }
echo "transformer_engine: ok"
python3 -c "import megatron.bridge.training.pretrain" || { echo "Megatron Bridge's training does not import" >&2; exit 1; }
echo "megatron.bridge: ok"
