// RUN: not stageml-opt %s -p lora-sites 2>&1 | filecheck %s

// A multi-tenant compile needs LoRA sites: an adapter-time delta added to
// the weight (not PEFT's x@A^T@B^T) is none.

// CHECK: stageml-opt: error: the model has no LoRA site (x@W + s*(x@A^T)@B^T, a merged parameter W + s*(B@A), or an MoE expert stack W + s*bmm(B, A), with adapter-time PEFT lora_A/lora_B weights): compile a PEFT LoRA model, or compile without max_adapters
// CHECK-NOT: Traceback
// CHECK-NOT: module
func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[4,8],f32> {bt.name = "fc.delta", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,4],f32> attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %0 = torch.aten.add.Tensor %arg0, %arg1, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,8],f32>, !torch.vtensor<[4,8],f32>, !torch.int -> !torch.vtensor<[4,8],f32>
  %1 = torch.aten.transpose.int %0, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  %2 = torch.aten.matmul %arg2, %1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  return %2 : !torch.vtensor<[?,4],f32>
}
