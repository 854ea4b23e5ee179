// RUN: stageml-opt %s -p bt-lift | filecheck %s
// RUN: stageml-opt %s -p bt-lift | filecheck %s --check-prefix=CONST

// Every use of a value at a later time goes through a "bt.lift" {from, to,
// name}: one lift per (value, later time), shared by all users there; a
// lifted argument keeps its model name, a computed value is `<time>.<n>`
// (`<program>.<time>.<n>` in a program other than "main"); an earlier-time
// function result is lifted to dynamic. The input is bt-propagate's output.

// CHECK-LABEL: func.func @main
// CHECK:      %[[WT:[0-9]+]] = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">}
// CHECK-NEXT: %[[DT:[0-9]+]] = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"adapter">}
// CHECK-NEXT: %[[L0:[0-9]+]] = "bt.lift"(%[[WT]]) {bt.time = #bt.time<"adapter">, from = #bt.time<"static">, name = "static.0", to = #bt.time<"adapter">} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
// CHECK-NEXT: %[[M:[0-9]+]] = torch.aten.add.Tensor %[[L0]], %[[DT]], %int1 {bt.time = #bt.time<"adapter">}
// The same static value, now needed at request time: a second lift, same name.
// CHECK-NEXT: %[[L1:[0-9]+]] = "bt.lift"(%[[WT]]) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "static.0", to = #bt.time<"dynamic">}
// CHECK-NEXT: %[[Y0:[0-9]+]] = torch.aten.matmul %arg2, %[[L1]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT: %[[Y1:[0-9]+]] = torch.aten.matmul %arg2, %[[L1]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT: %[[SUM:[0-9]+]] = torch.aten.add.Tensor %[[Y0]], %[[Y1]], %int1 {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT: %[[L2:[0-9]+]] = "bt.lift"(%[[M]]) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "adapter.0", to = #bt.time<"dynamic">}
// CHECK-NEXT: %[[Y2:[0-9]+]] = torch.aten.matmul %arg2, %[[L2]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT: %[[L3:[0-9]+]] = "bt.lift"(%arg0) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "fc.weight", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,8],f32>) -> !torch.vtensor<[4,8],f32>
// CHECK-NEXT: return %[[SUM]], %[[Y2]], %[[L3]] :

// In the "factorized" program computed values are named after the program;
// a lifted argument still keeps its model name.
// CHECK-LABEL: func.func @main_factorized
// CHECK:      %[[FWT:[0-9]+]] = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">}
// CHECK-NEXT: %[[FL0:[0-9]+]] = "bt.lift"(%[[FWT]]) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "factorized.static.0", to = #bt.time<"dynamic">}
// CHECK-NEXT: %[[FY0:[0-9]+]] = torch.aten.matmul %arg2, %[[FL0]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT: %[[FAT:[0-9]+]] = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"adapter">}
// CHECK-NEXT: %[[FL1:[0-9]+]] = "bt.lift"(%[[FAT]]) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "factorized.adapter.0", to = #bt.time<"dynamic">}
// CHECK-NEXT: %[[FY1:[0-9]+]] = torch.aten.matmul %arg2, %[[FL1]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT: %[[FL2:[0-9]+]] = "bt.lift"(%arg1) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "fc.delta", to = #bt.time<"dynamic">}
// CHECK-NEXT: return %[[FY0]], %[[FY1]], %[[FL2]] :

// Constants (%int1, used at all three times) are cloned by bt-split, never lifted.
// CONST-NOT: "bt.lift"(%int
func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[4,8],f32> {bt.name = "fc.delta", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> (!torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,8],f32>) attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  %1 = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  %2 = torch.aten.add.Tensor %0, %1, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,4],f32>, !torch.vtensor<[8,4],f32>, !torch.int -> !torch.vtensor<[8,4],f32>
  %3 = torch.aten.matmul %arg2, %0 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  %4 = torch.aten.matmul %arg2, %0 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  %5 = torch.aten.add.Tensor %3, %4, %int1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.int -> !torch.vtensor<[?,4],f32>
  %6 = torch.aten.matmul %arg2, %2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  return %5, %6, %arg0 : !torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,8],f32>
}

func.func @main_factorized(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[4,8],f32> {bt.name = "fc.delta", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> (!torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,8],f32>) attributes {bt.program = "factorized"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  %1 = torch.aten.matmul %arg2, %0 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  %2 = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  %3 = torch.aten.matmul %arg2, %2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  return %1, %3, %arg1 : !torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,8],f32>
}
