// RUN: stageml-opt %s -p bt-verify | filecheck %s

// Congruent, lifted IR passes unchanged: every op is no earlier than its
// operands, each stage crossing of a tensor is a forward "bt.lift", and a
// static constant (%int1) may be used at any later time without one.
// (bt-verify-error.mlir and bt-verify-lift-error.mlir hold the failures.)

// CHECK-LABEL: func.func @main
// CHECK:      %[[WT:[0-9]+]] = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">}
// CHECK-NEXT: %[[L0:[0-9]+]] = "bt.lift"(%[[WT]]) {bt.time = #bt.time<"adapter">, from = #bt.time<"static">, name = "static.0", to = #bt.time<"adapter">}
// CHECK-NEXT: %[[M:[0-9]+]] = torch.aten.add.Tensor %[[L0]], %arg1, %int1 {bt.time = #bt.time<"adapter">}
// CHECK-NEXT: %[[L1:[0-9]+]] = "bt.lift"(%[[M]]) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "adapter.0", to = #bt.time<"dynamic">}
// CHECK-NEXT: %[[Y:[0-9]+]] = torch.aten.matmul %arg2, %[[L1]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT: return %[[Y]] : !torch.vtensor<[?,4],f32>
func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[8,4],f32> {bt.name = "fc.delta", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,4],f32> attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  %1 = "bt.lift"(%0) {bt.time = #bt.time<"adapter">, from = #bt.time<"static">, name = "static.0", to = #bt.time<"adapter">} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %2 = torch.aten.add.Tensor %1, %arg1, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,4],f32>, !torch.vtensor<[8,4],f32>, !torch.int -> !torch.vtensor<[8,4],f32>
  %3 = "bt.lift"(%2) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "adapter.0", to = #bt.time<"dynamic">} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %4 = torch.aten.matmul %arg2, %3 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  return %4 : !torch.vtensor<[?,4],f32>
}
