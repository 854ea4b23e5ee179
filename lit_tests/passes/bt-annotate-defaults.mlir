// RUN: stageml-opt %s -p bt-annotate | filecheck %s

// stageml-opt knows no parameter names, so with no --stage only PEFT's
// adapter names get a time other than dynamic (as they do with a --stage,
// bt-annotate.mlir).

// CHECK-LABEL: func.func @main
// CHECK-SAME: {bt.name = "fc.weight", bt.time = #bt.time<"dynamic">}
// CHECK-SAME: {bt.name = "fc.lora_A.weight", bt.time = #bt.time<"adapter">}
// CHECK-SAME: {bt.name = "x", bt.time = #bt.time<"dynamic">}
// CHECK-SAME: {bt.time = #bt.time<"dynamic">}
func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight"}, %arg1: !torch.vtensor<[2,8],f32> {bt.name = "fc.lora_A.weight"}, %arg2: !torch.vtensor<[?,8],f32> {bt.name = "x"}, %arg3: !torch.vtensor<[4],f32>) -> !torch.vtensor<[8,4],f32> attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  return %0 : !torch.vtensor<[8,4],f32>
}
