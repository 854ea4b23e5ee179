// RUN: stageml-opt %s -p 'lora-sites{max-rank=8}' | filecheck %s

// A LoRA layer the forward never runs (a causal LM's cross-attention, with no encoder states)
// leaves its factors as adapter-time arguments nothing reads: the module names them in
// bt.unread_factors, and only the layer that runs is a site.

// CHECK:         module attributes {
// CHECK-SAME:      bt.sites = [{{{.*}}lora_A = "fc.lora_A.default.weight"{{[^}]*}}}]
// CHECK-SAME:      bt.unread_factors = ["cross.lora_A.default.weight", "cross.lora_B.default.weight"]
// CHECK:         %arg5: !torch.vtensor<[4,64],f32> {bt.name = "cross.lora_A.default.weight"
func.func @main(%arg0: !torch.vtensor<[48,64],f32> {bt.name = "fc.base_layer.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[4,64],f32> {bt.name = "fc.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[48,4],f32> {bt.name = "fc.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,64],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg4: !torch.vtensor<[48,64],f32> {bt.name = "cross.base_layer.weight", bt.time = #bt.time<"static">}, %arg5: !torch.vtensor<[4,64],f32> {bt.name = "cross.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg6: !torch.vtensor<[48,4],f32> {bt.name = "cross.lora_B.default.weight", bt.time = #bt.time<"adapter">}) -> !torch.vtensor<[?,48],f32> attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %float2.000000e00 = torch.constant.float 2.000000e+00 {bt.time = #bt.time<"static">}
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[48,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,48],f32>
  %1 = torch.aten.matmul %arg3, %0 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,48],f32> -> !torch.vtensor<[?,48],f32>
  %2 = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,4],f32>
  %3 = torch.aten.matmul %arg3, %2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,4],f32> -> !torch.vtensor<[?,4],f32>
  %4 = torch.aten.transpose.int %arg2, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[48,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,48],f32>
  %5 = torch.aten.matmul %3, %4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,48],f32> -> !torch.vtensor<[?,48],f32>
  %6 = torch.aten.mul.Scalar %5, %float2.000000e00 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,48],f32>, !torch.float -> !torch.vtensor<[?,48],f32>
  %7 = torch.aten.add.Tensor %1, %6, %int1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,48],f32>, !torch.vtensor<[?,48],f32>, !torch.int -> !torch.vtensor<[?,48],f32>
  return %7 : !torch.vtensor<[?,48],f32>
}
