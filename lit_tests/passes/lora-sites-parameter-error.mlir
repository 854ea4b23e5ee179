// RUN: not stageml-opt %s -p lora-sites 2>&1 | filecheck %s

// PEFT's merged parameter W + B@A serves per request row only as the weight of
// products x @ W^T: one multiplying it untransposed cannot be served.

func.func @main(%arg0: !torch.vtensor<[6,64],f32> {bt.name = "mlp.gate.base_layer.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[2,64],f32> {bt.name = "mlp.gate.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[6,2],f32> {bt.name = "mlp.gate.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,6],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,64],f32> attributes {bt.program = "main"} {
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %0 = torch.aten.mm %arg2, %arg1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[6,2],f32>, !torch.vtensor<[2,64],f32> -> !torch.vtensor<[6,64],f32>
  %1 = torch.aten.add.Tensor %arg0, %0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[6,64],f32>, !torch.vtensor<[6,64],f32>, !torch.int -> !torch.vtensor<[6,64],f32>
  // CHECK: stageml-opt: error: loc("{{.*}}":[[# @LINE + 1]]:8): the parameter LoRA factor 'mlp.gate.lora_A.default.weight' merges into is used by 'torch.aten.mm', which cannot be served per request row; only products x @ W^T of the merged parameter can
  %2 = torch.aten.mm %arg3, %1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,6],f32>, !torch.vtensor<[6,64],f32> -> !torch.vtensor<[?,64],f32>
  return %2 : !torch.vtensor<[?,64],f32>
}
// CHECK-NOT: Traceback
// CHECK-NOT: module
