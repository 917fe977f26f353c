#!/usr/bin/env bash
# On the GPU host: install the offline bundle gathered in PARTS_DIR (../shared/gpu/README.md), with
# transformer-engine-torch unpacked from an earlier session's build where one for this host's torch is given.
# The bundle's installer builds that extension from source every time (71-135 s of a session's 30 device minutes);
# the build is a 3 MB library plus its metadata, the same on every host of one image.
#
#   usage: gpu_stack.sh PARTS_DIR INSTALLER [PREBUILT_TGZ]
#
# INSTALLER: the bundle's install_bundle.sh (it rides in the last part). PREBUILT_TGZ: te-torch-<torch version>.tgz,
# the torch version with every character other than letters, digits and '.' as '-' (files from $OUT come back only
# so named). Where it is for this host's torch, the wheels go in as the bundle's installer puts them and the build's
# files are unpacked beside them; if transformer_engine.pytorch then fails to import, or no such file is given, the
# bundle's installer runs (wheels and build), and with $OUT set the build's files are saved there under that name
# for the next session: keep it beside the bundle's last part (.gpu-bundle-tmp/p33/).
set -euo pipefail
parts=${1:?usage: gpu_stack.sh PARTS_DIR INSTALLER [PREBUILT_TGZ]}
installer=${2:?usage: gpu_stack.sh PARTS_DIR INSTALLER [PREBUILT_TGZ]}
prebuilt=${3:-}
t0=$(date +%s)
torch_tag=$(python3 -c "import torch; print(torch.__version__)" | tr -c 'A-Za-z0-9.\n' '-')
te_imports() { python3 -c "import torch, transformer_engine.pytorch" > /dev/null 2>&1; }

install_with_prebuilt() {
  local work; work=$(mktemp -d)
  cat "$parts"/part.* | tar xf - -C "$work"
  # the wheels as install_bundle.sh installs them (it has no switch to leave out its build)
  (cd "$work/wh" && python3 -m pip install -q --no-index --no-deps --no-build-isolation antlr4-python3-runtime-*.tar.gz \
    && { python3 -m pip install -q --no-index --no-deps ./*.whl 2>&1 | grep -v '^WARNING' || true; })
  rm -rf "$work"
  tar xzf "$prebuilt" -C "$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
  te_imports
}

save_build() {  # the installed files of transformer-engine-torch, as pip lists them, relative to its location
  local location files
  location=$(python3 -m pip show transformer-engine-torch | sed -n 's/^Location: //p') && [ -n "$location" ] \
    && files=$(python3 -m pip show -f transformer-engine-torch | sed -n '/^Files:/,$p' | tail -n +2 | sed 's/^ *//') \
    && [ -n "$files" ] && tar czf "$OUT/te-torch-$torch_tag.tgz" -C "$location" $files \
    && echo "saved the build as \$OUT/te-torch-$torch_tag.tgz ($(du -h "$OUT/te-torch-$torch_tag.tgz" | cut -f1))"
}

if [ -n "$prebuilt" ] && [ "$(basename "$prebuilt")" = "te-torch-$torch_tag.tgz" ] && [ -f "$prebuilt" ] \
    && install_with_prebuilt; then
  echo "wheels installed, transformer-engine-torch unpacked from $prebuilt: $(( $(date +%s) - t0 )) s"
else
  [ -n "$prebuilt" ] && echo "no usable build of transformer-engine-torch for torch $torch_tag in '$prebuilt': building it"
  bash "$installer" "$parts"
  [ -z "${OUT:-}" ] || save_build || echo "could not save the build of transformer-engine-torch (the install stands)"
fi
te_imports && echo "transformer_engine: ok"
python3 -c "import megatron.bridge.training.pretrain" 2>/dev/null && echo "megatron.bridge: ok"
